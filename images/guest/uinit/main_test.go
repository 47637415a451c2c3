package main

import (
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
