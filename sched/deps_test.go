package sched_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestImports keeps sched pure: production files import the standard
// library (no I/O packages) and proto only; schedtest adds sched. Nothing
// imports testing, the coordinator, the agent or host code.
func TestImports(t *testing.T) {
	t.Parallel()
	allowed := map[string][]string{
		".": {"errors", "fmt", "slices", "strings", "sync", "github.com/gpuaas/gpuaas/proto"},
		"schedtest": {"encoding/json", "errors", "fmt", "hash/fnv", "maps", "slices",
			"github.com/gpuaas/gpuaas/proto", "github.com/gpuaas/gpuaas/sched"},
	}
	for dir, ok := range allowed {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		require.NotEmpty(t, files)
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			require.NoError(t, err)
			for _, imp := range af.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				require.Contains(t, ok, p, "%s imports %s", f, p)
			}
		}
	}
}
