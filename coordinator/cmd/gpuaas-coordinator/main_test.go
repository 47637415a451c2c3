package main

import (
	"fmt"
	"os"
	"testing"

	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
)

// coordinatorBin is the binary under test, built once by TestMain.
var coordinatorBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gpuaas-coordinator-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	coordinatorBin, err = proctest.Build(dir)
	if err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
