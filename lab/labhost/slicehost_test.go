package labhost

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// attachedLoops returns the loop devices whose backing file is under dir.
func attachedLoops(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	require.NoError(t, err)
	var loops []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
			loops = append(loops, filepath.Base(filepath.Dir(filepath.Dir(f))))
		}
	}
	return loops
}

// A slice host set up and closed leaves nothing: its loop devices are
// detached, its bridge and VM folder gone, its lease released, and the
// shared daemons its set-up started are stopped (those already running
// keep running) — what `make lab` does on Ctrl-C.
func TestPrivilegedSliceHostClose(t *testing.T) {
	testenv.Root(t)
	if err := Installed(); err != nil {
		testenv.Missing(t, "the real slice host's packages", err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	base := t.TempDir()
	root, err := hostsim.Generate(filepath.Join(base, "host"), "j22u15")
	require.NoError(t, err)
	wasRunning := map[string]bool{}
	for _, d := range Shared() {
		wasRunning[d.Name] = d.Pid != 0
	}
	rnd := make([]byte, 3)
	_, _ = rand.Read(rnd)
	dir := filepath.Join(base, "slicehost")
	sh, err := SetupSlice(ctx, SliceOptions{Root: root, Dir: dir, DiskSize: 16 << 20, Bridge: "glt" + hex.EncodeToString(rnd),
		Gateway: fmt.Sprintf("10.%d.%d.1/24", 150+int(rnd[0])%50, rnd[1])}, t.Logf)
	require.NoError(t, err)
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = sh.Close(context.Background())
		}
	})
	me := describePid(os.Getpid())
	require.Contains(t, Users(), me, "the slice host holds a lease")
	require.Len(t, attachedLoops(t, dir), len(sh.Loops))
	require.Len(t, sh.Loops, 8)
	vsctl := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "ovs-vsctl", append([]string{"--timeout=10"}, args...)...)
		cmd.Env = append(os.Environ(), OVSEnv()...)
		return cmd.Run()
	}
	require.NoError(t, vsctl("br-exists", sh.Slice.Bridge))
	require.DirExists(t, sh.Slice.VMDir)
	started := sh.Started
	for _, name := range []string{"libvirtd", "ovs-vswitchd", "ovsdb-server"} { // virtlogd may be one started otherwise
		if !wasRunning[name] {
			require.True(t, started, "%s was not running before the set-up, so it started it", name)
		}
	}

	closed = true
	require.NoError(t, sh.Close(ctx))
	require.Empty(t, attachedLoops(t, dir), "loop devices left attached")
	require.NoDirExists(t, sh.Slice.VMDir)
	require.NotContains(t, Users(), me, "the lease is released")
	for _, d := range Shared() {
		switch {
		case wasRunning[d.Name]:
			require.NotZero(t, d.Pid, "%s ran before the set-up: it is not the slice host's to stop", d.Name)
		case len(Users()) > 0:
			t.Logf("%s left running: in use by %v", d.Name, Users())
		default:
			require.Zero(t, d.Pid, "%s was started by the set-up and must be stopped by Close", d.Name)
		}
	}
	// The bridge is gone from the database, whether or not OVS still runs.
	out, err := exec.CommandContext(ctx, "ovsdb-tool", "query", filepath.Join(OVSRunDir, "conf.db"),
		`["Open_vSwitch",{"op":"select","table":"Bridge","where":[["name","==","`+sh.Slice.Bridge+`"]],"columns":["name"]}]`).Output()
	require.NoError(t, err)
	require.Equal(t, `[{"rows":[]}]`, strings.TrimSpace(string(out)), "bridge %s left behind", sh.Slice.Bridge)
}
