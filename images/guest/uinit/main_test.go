package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseSeed(t *testing.T) {
	s := parseSeed("instance-id: i-abc123\nlocal-hostname: slice-a1\n",
		"#cloud-config\nhostname: slice-a1\nssh_authorized_keys:\n  - ssh-ed25519 AAAAkey1 op@host\n  - \"ssh-rsa AAAAkey2\"\nruncmd:\n  - echo hi\n")
	require.Equal(t, "i-abc123", s.InstanceID)
	require.Equal(t, "slice-a1", s.Hostname)
	require.Equal(t, []string{"ssh-ed25519 AAAAkey1 op@host", "ssh-rsa AAAAkey2"}, s.SSHKeys)
}

func TestReadSeedFileISOLevel1Name(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "meta_data"), []byte("instance-id: i-1\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "user-data"), []byte("#cloud-config\n"), 0o644))
	b, err := readSeedFile(dir, "meta-data")
	require.NoError(t, err)
	require.Equal(t, "instance-id: i-1\n", string(b))
	b, err = readSeedFile(dir, "user-data")
	require.NoError(t, err)
	require.Equal(t, "#cloud-config\n", string(b))
	_, err = readSeedFile(dir, "network-config")
	require.ErrorIs(t, err, os.ErrNotExist)
}
