// Package deptest enforces the package boundaries of ../shared/DESIGN.md:
// proto imports nothing of ours, sched is pure, hostops never reaches up
// into the coordinator or agent (internal/ holds standard-library-only
// leaves every layer may use), production code never imports testing.
package deptest

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/gpuaas/gpuaas"

type pkg struct {
	ImportPath string
	Name       string
	Imports    []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", module+"/...")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	dec := json.NewDecoder(out)
	var pkgs []pkg
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else {
			require.NoError(t, err)
		}
		pkgs = append(pkgs, p)
	}
	require.NoError(t, cmd.Wait())
	require.NotEmpty(t, pkgs)
	return pkgs
}

func under(path, dir string) bool {
	p := module + "/" + dir
	return path == p || strings.HasPrefix(path, p+"/")
}

func TestImportRules(t *testing.T) {
	for _, p := range listPackages(t) {
		// Test-only helper packages may import testing.
		testHelper := strings.HasSuffix(p.ImportPath, "test") || under(p.ImportPath, "test")
		for _, imp := range p.Imports {
			ours := strings.HasPrefix(imp, module+"/")
			switch {
			case under(p.ImportPath, "proto") && ours && !under(imp, "proto"):
				t.Errorf("%s imports %s: proto imports nothing of ours", p.ImportPath, imp)
			case under(p.ImportPath, "sched") && ours && !under(imp, "proto") && !under(imp, "sched"):
				t.Errorf("%s imports %s: sched may import only proto", p.ImportPath, imp)
			case under(p.ImportPath, "internal") && ours:
				t.Errorf("%s imports %s: internal packages are leaves (standard library only), usable from every layer", p.ImportPath, imp)
			case under(p.ImportPath, "hostops") && ours && !under(imp, "proto") && !under(imp, "hostops") && !under(imp, "internal") && !testHelper:
				t.Errorf("%s imports %s: hostops may import only proto, hostops and the internal leaves", p.ImportPath, imp)
			case (under(p.ImportPath, "coordinator") || under(p.ImportPath, "agent")) && (under(imp, "lab") || under(imp, "test")) && !testHelper:
				t.Errorf("%s imports %s: production code never imports lab or test", p.ImportPath, imp)
			case imp == "testing" && !testHelper:
				t.Errorf("%s imports testing: production code never does (name a test helper package *test)", p.ImportPath)
			}
		}
	}
}
