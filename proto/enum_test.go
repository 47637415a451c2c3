package proto

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMessageTypeNumbersUnique parses every file of this package and fails
// if two MessageType constants share a number: command types are added in
// different files by parallel work, and a collision would make replicas
// apply one command as another.
func TestMessageTypeNumbersUnique(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	seen := map[int64]string{}
	count := 0
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		require.NoError(t, err)
		for _, decl := range file.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				id, ok := vs.Type.(*ast.Ident)
				if !ok || id.Name != "MessageType" || len(vs.Values) != len(vs.Names) {
					continue
				}
				for i, name := range vs.Names {
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok {
						continue
					}
					n, err := strconv.ParseInt(lit.Value, 0, 64)
					require.NoError(t, err)
					if name.Name == "IgnoreUnknownTypeFlag" {
						continue
					}
					if prev, dup := seen[n]; dup {
						t.Errorf("MessageType %d is both %s and %s (%s)", n, prev, name.Name, fset.Position(name.Pos()))
					}
					seen[n] = name.Name
					count++
				}
			}
		}
	}
	require.Greater(t, count, 25, "the parse found the command enum")
}
