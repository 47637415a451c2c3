package labhost

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/test/testenv"
)

func TestParseStatPPid(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       int
		err        string
	}{
		{"plain", "4242 (libvirtd) S 4241 4242 4242 0 -1 4194560", 4241, ""},
		{"comm with spaces and parens", "77 (we ird) (x)) R 1 77 77 0", 1, ""},
		{"no comm", "77 libvirtd S 1", 0, `no ")"`},
		{"truncated", "77 (libvirtd) S", 0, "no ppid"},
		{"not a number", "77 (libvirtd) S x1 2", 0, "not a pid"},
		{"negative", "77 (libvirtd) S -1 2", 0, "not a pid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatPPid(tc.stat)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// The lab's libvirtd runs under tini as a child subreaper, so a QEMU that
// exits is reaped at once instead of when this machine's PID 1 gets to it.
func TestPrivilegedLibvirtdUnderReaper(t *testing.T) {
	testenv.Root(t)
	testenv.Commands(t, "libvirtd", "virtlogd", "virsh", reaper)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	release, err := Use()
	require.NoError(t, err)
	defer release()
	require.NoError(t, EnsureOVS(ctx))
	require.NoError(t, EnsureLibvirtd(ctx, t.Logf))
	pid, ok := libvirtdPid()
	require.True(t, ok, "libvirtd pid")
	ppid, err := parentPid(pid)
	require.NoError(t, err)
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", ppid))
	require.NoError(t, err)
	require.Equal(t, reaper, strings.TrimSpace(string(comm)), "libvirtd's parent")
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", ppid))
	require.NoError(t, err)
	require.Contains(t, strings.Split(string(cmdline), "\x00"), "-s", "tini runs as a child subreaper")
	require.True(t, reaped())
}
