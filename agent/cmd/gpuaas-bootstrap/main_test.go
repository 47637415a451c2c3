package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunRefusesBadInputs: bad flags or inputs stop the program before
// it writes anything under the host root.
func TestRunRefusesBadInputs(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	env := filepath.Join(root, "bootstrap.env")
	good := "GPUAAS_COORDINATOR=http://127.0.0.1:1\nGPUAAS_NODE_ID=j22u15\nGPUAAS_BOOTSTRAP_TOKEN=gpb_" + strings.Repeat("ab", 32) + "\n"
	cases := map[string]struct {
		env  string
		args []string
		want string
	}{
		"missing env file": {"", []string{"-env-file", filepath.Join(root, "nope")}, "read bootstrap inputs"},
		"bad token":        {strings.Replace(good, "gpb_", "xyz_", 1), nil, "GPUAAS_BOOTSTRAP_TOKEN"},
		"bad start mode":   {good, []string{"-agent-start", "init.d"}, "use systemd or exec"},
		"extra argument":   {good, []string{"now"}, "unexpected arguments"},
		"relative root":    {good, []string{"-root", "host"}, "must be absolute"},
	}
	for name, tc := range cases {
		if tc.env != "" {
			require.NoError(t, os.WriteFile(env, []byte(tc.env), 0o600))
		}
		args := append([]string{"-env-file", env, "-root", root, "-state-dir", filepath.Join(root, "state")}, tc.args...)
		err := run(args)
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), tc.want, name)
	}
	_, err := os.Stat(filepath.Join(root, "etc"))
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing was installed")
}
