package command_test

import (
	"context"
	"errors"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops/command"
)

func TestExecStdoutEnvStdin(t *testing.T) {
	t.Parallel()
	e := command.Exec{Env: []string{"GPUAAS_TEST_VALUE=hello"}}
	out, err := e.Run(context.Background(), command.Cmd{Name: "sh", Args: []string{"-c", `printf '%s ' "$GPUAAS_TEST_VALUE"; cat`}, Stdin: "from-stdin"})
	require.NoError(t, err)
	assert.Equal(t, "hello from-stdin", string(out))
}

func TestExecFailureCarriesStderr(t *testing.T) {
	t.Parallel()
	_, err := command.Exec{}.Run(context.Background(), command.Cmd{Name: "sh", Args: []string{"-c", "echo boom >&2; exit 3"}})
	require.Error(t, err)
	var ce *command.Error
	require.True(t, errors.As(err, &ce))
	assert.Contains(t, err.Error(), "boom")
	assert.Contains(t, err.Error(), "sh -c")
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee))
	assert.Equal(t, 3, ee.ExitCode())
}

func TestExecCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := command.Exec{}.Run(ctx, command.Cmd{Name: "sleep", Args: []string{"5"}})
	require.ErrorIs(t, err, context.Canceled)
}
