package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

// TestSSHExec runs commands through the guest's SSH server with the Go
// client the readiness gate uses: output, exit status and channel close
// must all arrive (u-root's sshd deadlocks here).
func TestSSHExec(t *testing.T) {
	t.Parallel()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	signer, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	cfg, err := sshConfig(ssh.MarshalAuthorizedKey(signer.PublicKey()))
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go serveSSH(ln, cfg)

	client, err := ssh.Dial("tcp", ln.Addr().String(), &ssh.ClientConfig{
		User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 5 * time.Second,
	})
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })

	run := func(cmd string) (stdout, stderr string, err error) {
		s, err := client.NewSession()
		require.NoError(t, err)
		defer s.Close()
		var o, e bytes.Buffer
		s.Stdout, s.Stderr = &o, &e
		done := make(chan error, 1)
		go func() { done <- s.Run(cmd) }()
		select {
		case err := <-done:
			return o.String(), e.String(), err
		case <-time.After(20 * time.Second):
			t.Fatalf("ssh %q: no answer in 20 s", cmd)
			return "", "", nil
		}
	}
	out, errOut, err := run("echo hello; echo oops >&2")
	require.NoError(t, err)
	require.Equal(t, "hello\n", out)
	require.Equal(t, "oops\n", errOut)
	_, _, err = run("exit 3")
	var ee *ssh.ExitError
	require.True(t, errors.As(err, &ee), "%v", err)
	require.Equal(t, 3, ee.ExitStatus())

	// A key not in authorized_keys is refused.
	_, other, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	os, err := ssh.NewSignerFromKey(other)
	require.NoError(t, err)
	_, err = ssh.Dial("tcp", ln.Addr().String(), &ssh.ClientConfig{
		User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(os)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 5 * time.Second,
	})
	require.Error(t, err)

	_, err = sshConfig([]byte("\n"))
	require.Error(t, err, "no keys, no server")
}
