package apprun_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/agent/apprun"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// hostSSH serves SSH on a loopback port, running each exec with /bin/sh
// on this host, for the allocation key only: this host stands in for a
// guest (its sshd does the same, images/guest/uinit/sshd.go).
func hostSSH(t *testing.T, allowed ssh.PublicKey) string {
	t.Helper()
	_, hostPriv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	hostKey, err := ssh.NewSignerFromKey(hostPriv)
	require.NoError(t, err)
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if string(k.Marshal()) == string(allowed.Marshal()) {
			return nil, nil
		}
		return nil, errors.New("unknown key")
	}}
	cfg.AddHostKey(hostKey)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_, chans, reqs, err := ssh.NewServerConn(c, cfg)
				if err != nil {
					return
				}
				go ssh.DiscardRequests(reqs)
				for nc := range chans {
					ch, creqs, err := nc.Accept()
					if err != nil {
						continue
					}
					go func() {
						defer ch.Close()
						for req := range creqs {
							if req.Type != "exec" {
								req.Reply(false, nil)
								continue
							}
							var p struct{ Command string }
							ssh.Unmarshal(req.Payload, &p)
							req.Reply(true, nil)
							cmd := exec.Command("/bin/sh", "-c", p.Command)
							cmd.Stdin, cmd.Stdout, cmd.Stderr = ch, ch, ch.Stderr()
							status := 0
							if err := cmd.Run(); err != nil {
								status = 1
								var ee *exec.ExitError
								if errors.As(err, &ee) {
									status = ee.ExitCode()
								}
							}
							ch.CloseWrite()
							var b [4]byte
							binary.BigEndian.PutUint32(b[:], uint32(status))
							ch.SendRequest("exit-status", false, b[:])
							return
						}
					}()
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestPrivilegedGuestRunnerOverSSH drives the guest runner against this
// host over SSH (the lab-slice test, agent/slice TestPrivilegedSliceApp,
// does it against a real guest): the allocation's key only, the bundle
// streamed in and unpacked by GNU tar, the host's OCI runtime, the app on
// the "guest's" address, Start twice one container, Logs, Stop removes
// container, bundle and record.
func TestPrivilegedGuestRunnerOverSSH(t *testing.T) {
	testenv.Root(t)
	testenv.Commands(t, "tar")
	rt, err := apprun.DefaultLocalRuntime()
	if err != nil {
		testenv.Missing(t, "an OCI runtime", err.Error())
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	key, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	addr := hostSSH(t, key.PublicKey())
	host, portStr, _ := net.SplitHostPort(addr)
	sshPort, _ := strconv.Atoi(portStr)

	var asked []string
	g, err := apprun.NewGuest(apprun.GuestConfig{StateDir: t.TempDir(), SSHPort: sshPort, Runtime: rt, Tar: "tar",
		Key: func(_ context.Context, alloc string) (ssh.Signer, error) {
			asked = append(asked, alloc)
			return key, nil
		}})
	require.NoError(t, err)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	appPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := helloSpec(t, "gst-"+randHex(t))
	s.GuestAddr = host
	s.Env = map[string]string{"PORT": strconv.Itoa(appPort)}
	s.App.Ports = []proto.AppPort{{Name: "http", Port: appPort, Protocol: "http"}}
	s.App.HealthCheck = &proto.AppHealthCheck{Port: appPort, Path: "/healthz", TimeoutSeconds: 30}
	t.Cleanup(func() { g.Stop(context.Background(), s.InstanceID) })
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	st, err := g.Start(ctx, s)
	require.NoError(t, err)
	require.Equal(t, apprun.StateRunning, st.State, st.Detail)
	ep := fmt.Sprintf("%s:%d", host, appPort)
	require.Equal(t, ep, st.Endpoints[appPort])
	require.Contains(t, httpGet(t, "http://"+ep+"/"), s.InstanceID)
	require.Equal(t, s.AllocationID, asked[0], "the allocation's key is asked for")
	bundle := "/run/gpuaas/apps/" + apprun.ContainerName(s.InstanceID)
	require.FileExists(t, bundle+"/config.json")
	require.FileExists(t, bundle+"/rootfs/hello")

	st2, err := g.Start(ctx, s)
	require.NoError(t, err)
	require.Equal(t, apprun.StateRunning, st2.State)
	require.Equal(t, st.StartedAt, st2.StartedAt, "Start twice: the same container")
	out, err := exec.Command(rt, "list", "-q").Output()
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(string(out), apprun.ContainerName(s.InstanceID)))

	logs, err := g.Logs(ctx, s.InstanceID, 4096)
	require.NoError(t, err)
	require.Contains(t, string(logs), "listening on :"+strconv.Itoa(appPort))

	require.NoError(t, g.Stop(ctx, s.InstanceID))
	_, err = os.Stat(bundle)
	require.True(t, os.IsNotExist(err), "the bundle is removed")
	_, err = g.Status(ctx, s.InstanceID)
	require.ErrorIs(t, err, apprun.ErrNotFound)
	require.NoError(t, g.Stop(ctx, s.InstanceID))

	// Bad input changes nothing.
	bad := s
	bad.GuestAddr = "not-an-ip"
	_, err = g.Start(ctx, bad)
	require.ErrorContains(t, err, "not an IP address")
	bad = s
	bad.GPUs = []string{"0000:00:00.0; reboot"}
	_, err = g.Start(ctx, bad)
	require.ErrorContains(t, err, "not a PCI address")
}
