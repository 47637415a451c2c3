package apprun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/proto"
)

func recordFor(t *testing.T, srv *httptest.Server, path string, timeout int) *record {
	host, port, err := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	p, _ := strconv.Atoi(port)
	return &record{InstanceID: "i", Host: host, Ports: []proto.AppPort{{Name: "http", Port: p, Protocol: "http"}},
		Health: &proto.AppHealthCheck{Port: p, Path: path, TimeoutSeconds: timeout}}
}

func TestHealthGate(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := calls.Add(1); r.URL.Path == "/healthz" && n >= 3 {
			fmt.Fprintln(w, "ok")
			return
		}
		http.Error(w, "not yet", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	alive := func(context.Context) error { return nil }

	require.NoError(t, healthy(context.Background(), recordFor(t, srv, "/healthz", 10), alive), "passes once the app answers 2xx")

	err := healthy(context.Background(), recordFor(t, srv, "/never", 1), alive)
	require.ErrorContains(t, err, "503 Service Unavailable after 1s", "the timeout names the last probe's answer")

	dead := func(context.Context) error { return errors.New("the container is stopped") }
	start := time.Now()
	err = healthy(context.Background(), recordFor(t, srv, "/never", 30), dead)
	require.ErrorContains(t, err, "the container is stopped")
	require.Less(t, time.Since(start), 10*time.Second, "an exited container fails the gate without waiting out the timeout")

	r := recordFor(t, srv, "", 5)
	require.NoError(t, healthy(context.Background(), r, alive), "no path: a TCP connect check")
}

// fakeShell answers commands from a table (prefix -> output or error).
type fakeShell struct {
	answers map[string]string
	ran     []string
}

func (f *fakeShell) run(_ context.Context, cmd string, _ io.Reader) ([]byte, error) {
	f.ran = append(f.ran, cmd)
	for prefix, out := range f.answers {
		if strings.HasPrefix(cmd, prefix) {
			if strings.HasPrefix(out, "ERR ") {
				return nil, errors.New(strings.TrimPrefix(out, "ERR "))
			}
			return []byte(out), nil
		}
	}
	return nil, fmt.Errorf("%s: exit status 1: No such file or directory", cmd)
}

func TestGPUOptions(t *testing.T) {
	g := &Guest{}
	sh := &fakeShell{answers: map[string]string{
		"cat /proc/driver/nvidia/gpus/0000:01:00.0/information": "Model: NVIDIA H200\nIRQ: 42\nDevice Minor: 0\n",
		"cat /proc/driver/nvidia/gpus/0000:02:00.0/information": "Model: NVIDIA H200\nDevice Minor: 3\n",
		"cat /proc/devices":                         "Character devices:\n195 nvidia\n507 nvidia-uvm\n",
		"ls /usr/bin/nvidia-container-runtime-hook": "/usr/bin/nvidia-container-runtime-hook\n",
	}}
	o, err := g.gpuOptions(context.Background(), sh, []string{"0000:01:00.0", "0000:02:00.0"})
	require.NoError(t, err)
	var paths []string
	for _, d := range o.Devices {
		paths = append(paths, fmt.Sprintf("%s %d:%d", d.Path, d.Major, d.Minor))
	}
	require.Equal(t, []string{"/dev/nvidia0 195:0", "/dev/nvidia3 195:3", "/dev/nvidiactl 195:255",
		"/dev/nvidia-uvm 507:0", "/dev/nvidia-uvm-tools 507:1"}, paths)
	require.Len(t, o.Hooks, 1)
	require.Equal(t, "/usr/bin/nvidia-container-runtime-hook", o.Hooks[0].Path)

	// The runtime config admits exactly those devices.
	s := Spec{InstanceID: "i", AllocationID: "a"}
	s.App.Image = "x/y@sha256:" + strings.Repeat("a", 64)
	rs, err := runtimeConfig(s, ImageConfig{Config: ContainerConfig{Cmd: []string{"/x"}}}, t.TempDir(), o)
	require.NoError(t, err)
	require.Len(t, rs.Linux.Devices, 5)
	last := rs.Linux.Resources.Devices[len(rs.Linux.Resources.Devices)-1]
	require.True(t, last.Allow)
	require.Equal(t, int64(507), *last.Major)
	require.False(t, rs.Linux.Resources.Devices[0].Allow, "everything else is denied first")

	_, err = g.gpuOptions(context.Background(), &fakeShell{}, []string{"0000:03:00.0"})
	require.ErrorContains(t, err, "GPU 0000:03:00.0 is not visible to the guest's NVIDIA driver")
	_, err = g.gpuOptions(context.Background(), &fakeShell{answers: map[string]string{"cat /proc/driver": "Model: x\n"}}, []string{"0000:03:00.0"})
	require.ErrorContains(t, err, "no device minor")
}

func TestPreflightNoPivot(t *testing.T) {
	g := &Guest{cfg: GuestConfig{Runtime: "/usr/bin/crun", Tar: "/usr/bin/tar"}}
	for mounts, want := range map[string]bool{
		"rootfs / rootfs rw 0 0\nproc /proc proc rw 0 0\n":           true,
		"/dev/vda1 / ext4 rw,relatime 0 0\nproc /proc proc rw 0 0\n": false,
		"none / tmpfs rw 0 0\n":                                      false,
	} {
		got, err := g.preflight(context.Background(), &fakeShell{answers: map[string]string{"/usr/bin/crun --version": mounts}})
		require.NoError(t, err)
		require.Equal(t, want, got, mounts)
	}
	_, err := g.preflight(context.Background(), &fakeShell{answers: map[string]string{"/usr/bin/crun": "ERR exit status 127: crun: not found"}})
	require.ErrorContains(t, err, "needs the OCI runtime /usr/bin/crun and GNU tar")
}

// TestGuestGone: once the allocation's guest is gone (its key source says
// so), Status reports the instance stopped and Stop forgets it.
func TestGuestGone(t *testing.T) {
	g, err := NewGuest(GuestConfig{StateDir: t.TempDir(), Key: func(context.Context, string) (ssh.Signer, error) {
		return nil, fmt.Errorf("%w: allocation a1 released", ErrGuestGone)
	}})
	require.NoError(t, err)
	require.NoError(t, g.recs.put(&record{InstanceID: "i1", AllocationID: "a1", Container: containerName("i1"), Host: "10.0.0.9"}))
	st, err := g.Status(context.Background(), "i1")
	require.NoError(t, err)
	require.Equal(t, StateStopped, st.State)
	require.NoError(t, g.Stop(context.Background(), "i1"))
	_, err = g.Status(context.Background(), "i1")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = g.Logs(context.Background(), "i1", 10)
	require.ErrorIs(t, err, ErrNotFound)
}

// TestGuestEndpointsFromTheRecord: Endpoints answers from the record
// without reaching the guest (the workload proxy asks it per request; an
// SSH connection costs ~0.5 s under TCG).
func TestGuestEndpointsFromTheRecord(t *testing.T) {
	g, err := NewGuest(GuestConfig{StateDir: t.TempDir(),
		Key: func(context.Context, string) (ssh.Signer, error) {
			t.Error("Endpoints asked for the guest's key")
			return nil, errors.New("no key")
		},
		Dial: func(context.Context, string) (net.Conn, error) {
			t.Error("Endpoints dialled the guest")
			return nil, errors.New("no guest")
		}})
	require.NoError(t, err)
	require.NoError(t, g.recs.put(&record{InstanceID: "i1", AllocationID: "a1", Container: containerName("i1"), Host: "10.0.0.9",
		Ports: []proto.AppPort{{Port: 8080}, {Port: 9090}}}))
	eps, err := g.Endpoints(context.Background(), "i1")
	require.NoError(t, err)
	require.Equal(t, map[int]string{8080: "10.0.0.9:8080", 9090: "10.0.0.9:9090"}, eps)
	_, err = g.Endpoints(context.Background(), "i2")
	require.ErrorIs(t, err, ErrNotFound)
}
