package deptest

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEveryFuzzTargetIsInMakeFuzz: make fuzz explores the targets its
// FUZZ_TARGETS lists, so a Go fuzz target missing there would only ever
// run its seeds. Every func FuzzX(f *testing.F) of the module is listed
// as FuzzX:./its/package, and every listed one exists.
func TestEveryFuzzTargetIsInMakeFuzz(t *testing.T) {
	root := filepath.Join("..", "..")
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?s)FUZZ_TARGETS := (.*?)\n[a-z]`).FindSubmatch(mk)
	require.Len(t, m, 2, "the Makefile defines FUZZ_TARGETS")
	listed := map[string]bool{}
	for _, f := range strings.Fields(strings.ReplaceAll(string(m[1]), "\\", " ")) {
		listed[f] = true
	}
	fuzzFunc := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(\w+ \*testing\.F\)`)
	found := map[string]bool{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".") && p != root) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		for _, fm := range fuzzFunc.FindAllSubmatch(b, -1) {
			found[string(fm[1])+":./"+filepath.ToSlash(rel)] = true
		}
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, found)
	for f := range found {
		assert.True(t, listed[f], "fuzz target %s is not in the Makefile's FUZZ_TARGETS", f)
	}
	for f := range listed {
		assert.True(t, found[f], "FUZZ_TARGETS lists %s, which does not exist", f)
	}
}
