package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStateKeepsPortsAndFillsWhatOlderLabsLack(t *testing.T) {
	dir := t.TempDir()
	// A lab.json from before the agents: coordinators only.
	old := `{"coordinators":[{"id":"c1","http":"127.0.0.1:7300","raft":"127.0.0.1:7301"}]}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "lab.json"), []byte(old), 0o644))
	st, err := loadOrPickState(dir, 1, filepath.Join(dir, "roots"), labHosts)
	require.NoError(t, err)
	require.Len(t, st.Coordinators, 1)
	assert.Equal(t, "127.0.0.1:7300", st.Coordinators[0].HTTP, "ports are kept")
	assert.NotEmpty(t, st.Coordinators[0].Gossip, "a gossip port is picked")
	require.Len(t, st.Hosts, 3)
	for i, h := range st.Hosts {
		assert.Equal(t, labHosts[i], h.Name)
		assert.Equal(t, filepath.Join(dir, "roots", h.Name), h.Root)
		assert.Equal(t, filepath.Join(dir, "agents", h.Name), h.StateDir)
	}

	// Again, with one host only: its ports are the same, the others'
	// entries stay in lab.json for a later run.
	again, err := loadOrPickState(dir, 1, "", []string{"j22u11"})
	require.NoError(t, err)
	require.Len(t, again.Hosts, 1)
	assert.Equal(t, st.Hosts[1], again.Hosts[0])
	assert.Equal(t, st.Coordinators, again.Coordinators)
	var onDisk state
	b, err := os.ReadFile(filepath.Join(dir, "lab.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &onDisk))
	assert.Len(t, onDisk.Hosts, 3)

	_, err = loadOrPickState(dir, 3, "", labHosts)
	assert.ErrorContains(t, err, "run with -fresh")
}

func TestRunRefusesBadFlags(t *testing.T) {
	err := run([]string{"-dir", t.TempDir(), "-hosts", "j22u15,../etc"}, io.Discard)
	assert.ErrorContains(t, err, "is not a lab host")
	err = run([]string{"-dir", t.TempDir(), "-coordinators", "2"}, io.Discard)
	assert.ErrorContains(t, err, "use 1, 3 or 5")
}

// gpuaas-lab clean (make clean) deletes the lab folder and the host roots
// the lab generated outside it (in /dev/shm by default), but nothing
// else of a shared -hosts-dir.
func TestCleanRemovesTheHostRoots(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "lab")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	shm := filepath.Join(t.TempDir(), "shm")
	hosts := filepath.Join(shm, "gpuaas-lab-0123456789ab")
	st, err := loadOrPickState(dir, 1, hosts, labHosts)
	require.NoError(t, err)
	for _, h := range st.Hosts {
		require.NoError(t, os.MkdirAll(filepath.Join(h.Root, "sys"), 0o755))
	}
	other := filepath.Join(shm, "someone-else")
	require.NoError(t, os.MkdirAll(other, 0o755))

	var out bytes.Buffer
	require.NoError(t, run([]string{"clean", "-dir", dir}, &out))
	assert.Equal(t, "removed "+dir+" and its host roots in "+hosts+"\n", out.String())
	assert.NoDirExists(t, dir)
	assert.NoDirExists(t, hosts, "the host roots and their emptied folder are gone")
	assert.DirExists(t, other, "nothing else is touched")

	// Again: nothing left, no error.
	out.Reset()
	require.NoError(t, run([]string{"clean", "-dir", dir}, &out))
	assert.Equal(t, "removed "+dir+"\n", out.String())
}
