package dhcp_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func writePid(path, s string) error { return os.WriteFile(path, []byte(s), 0o644) }

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}
