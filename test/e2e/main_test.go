package e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// binDir holds the binaries TestMain built once for the package ("" with
// -short, where the process tests skip).
var (
	binDir   string
	buildErr error
)

func TestMain(m *testing.M) {
	flag.Parse()
	if !testing.Short() {
		var err error
		if binDir, err = os.MkdirTemp("", "gpuaas-e2e-bin-"); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			os.Exit(1)
		}
		out, err := exec.Command("go", "build", "-o", binDir+"/",
			"github.com/gpuaas/gpuaas/coordinator/cmd/gpuaas-coordinator",
			"github.com/gpuaas/gpuaas/coordinator/cmd/gpuaasctl",
			"github.com/gpuaas/gpuaas/agent/cmd/gpuaas-agent",
			"github.com/gpuaas/gpuaas/agent/cmd/gpuaas-bootstrap",
			"github.com/gpuaas/gpuaas/lab/cmd/gpuaas-lab",
			"github.com/gpuaas/gpuaas/lab/cmd/gpuaas-lab-agent").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %w: %s", err, out)
		}
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}
