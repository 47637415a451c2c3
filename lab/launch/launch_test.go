package launch

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/pki"
)

func TestProcStartStop(t *testing.T) {
	dir := t.TempDir()
	p := &Proc{Name: "sleeper", Args: []string{"/bin/sh", "-c", "echo hello; exec sleep 30"}, LogPath: filepath.Join(dir, "log", "s.log")}
	require.NoError(t, p.Start())
	require.True(t, p.Running())
	require.Error(t, p.Start(), "a running process cannot start twice")
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(p.LogPath)
		return string(b) == "hello\n"
	}, 5*time.Second, 20*time.Millisecond)
	start := time.Now()
	p.Stop(5 * time.Second)
	require.False(t, p.Running())
	require.Less(t, time.Since(start), 4*time.Second, "SIGTERM stops sleep at once")
	require.Error(t, p.Wait(context.Background()), "killed by a signal")
	f := &Proc{Name: "false", Args: []string{"/bin/sh", "-c", "exit 3"}, LogPath: filepath.Join(dir, "log", "f.log")}
	require.NoError(t, f.Start())
	require.ErrorContains(t, f.Wait(context.Background()), "exit status 3")
	// Restart after exit works (the lab restarts killed coordinators).
	require.NoError(t, p.Start())
	p.Kill()
	require.False(t, p.Running())
}

func TestTokens(t *testing.T) {
	tok, err := NewToken("lab-admin", "admin")
	require.NoError(t, err)
	require.Len(t, tok.SHA256, 64)
	path := filepath.Join(t.TempDir(), "tokens.json")
	require.NoError(t, WriteTokensFile(path, []Token{tok}))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NotContains(t, string(b), tok.Secret, "the tokens file holds hashes only")
}

func TestFreeGossipPort(t *testing.T) {
	port, err := FreeGossipPort()
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err, "the port is free for TCP")
	defer l.Close()
	u, err := net.ListenPacket("udp", addr)
	require.NoError(t, err, "and for UDP")
	u.Close()
}

// After a CA rotation the lab's clients trust what its coordinators
// trust (their rotation.json), beside the lab's first CA.
func TestTrustPEMFollowsTheCoordinatorsRotation(t *testing.T) {
	dir := t.TempDir()
	first, err := EnsureCA(dir)
	require.NoError(t, err)
	b, err := TrustPEM(dir)
	require.NoError(t, err)
	certs, err := pki.ParseCertsPEM(b)
	require.NoError(t, err)
	require.Len(t, certs, 1, "before any rotation: the first CA")

	next, err := pki.NewCA("rotated", time.Now(), time.Hour)
	require.NoError(t, err)
	rot, err := json.Marshal(map[string]any{"version": "v", "trusted": []string{string(next.CertPEM), string(first.CertPEM)}})
	require.NoError(t, err)
	for _, id := range []string{"c1", "c2"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "data", id, "tls"), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "data", id, "tls", "rotation.json"), rot, 0o600))
	}
	b, err = TrustPEM(dir)
	require.NoError(t, err)
	certs, err = pki.ParseCertsPEM(b)
	require.NoError(t, err)
	var ids []string
	for _, c := range certs {
		ids = append(ids, pki.ID(c))
	}
	assert.Equal(t, []string{pki.ID(first.Cert), pki.ID(next.Cert)}, ids, "each CA once")
	_, err = HTTPClient(dir)
	require.NoError(t, err)
}
