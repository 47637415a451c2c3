package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/proto"
)

// runArgsEnv makes the test binary act as gpuaasctl (see TestMain): the
// JSON-encoded arguments of one invocation. alloc ssh replaces the process
// with ssh, which only a separate process can show.
const runArgsEnv = "GPUAASCTL_TEST_RUN_ARGS"

func TestMain(m *testing.M) {
	if raw := os.Getenv(runArgsEnv); raw != "" {
		var args []string
		if err := json.Unmarshal([]byte(raw), &args); err != nil {
			panic(err)
		}
		os.Exit(Run(context.Background(), args, os.Stdout, os.Stderr, os.Getenv))
	}
	os.Exit(m.Run())
}

func TestSSHArgv(t *testing.T) {
	t.Parallel()
	acc := func(jump, user, cmd string) *proto.SliceAccess {
		return &proto.SliceAccess{GuestIP: "10.200.0.10", GuestMAC: "52:54:00:aa:00:01", JumpHost: jump, User: user, SSHCommand: cmd}
	}
	cases := []struct {
		name  string
		acc   *proto.SliceAccess
		o     sshOptions
		extra []string
		want  string
	}{
		{"no jump", acc("", "root", "ssh root@10.200.0.10"), sshOptions{}, nil, "ssh root@10.200.0.10"},
		{"user defaults to root", acc("", "", ""), sshOptions{}, nil, "ssh root@10.200.0.10"},
		{"jump as the agent names it", acc("10.0.0.15", "ubuntu", "ssh -J 10.0.0.15 ubuntu@10.200.0.10"), sshOptions{identity: "/tmp/k"}, nil,
			"ssh -i /tmp/k -J 10.0.0.15 ubuntu@10.200.0.10"},
		{"jump without a command", acc("10.0.0.15", "root", ""), sshOptions{}, nil, "ssh -J root@10.0.0.15 root@10.200.0.10"},
		{"jump user from the command", acc("h15.lab", "root", "ssh -J ops@h15.lab root@10.200.0.10"), sshOptions{}, nil,
			"ssh -J ops@h15.lab root@10.200.0.10"},
		{"loopback jump is this machine", acc("127.0.0.1", "root", "ssh -J 127.0.0.1 root@10.200.0.10"), sshOptions{identity: "/tmp/k"}, nil,
			"ssh -i /tmp/k root@10.200.0.10"},
		{"--direct", acc("10.0.0.15", "root", ""), sshOptions{direct: true}, nil, "ssh root@10.200.0.10"},
		{"extra args after the destination", acc("", "root", ""), sshOptions{}, []string{"-o", "StrictHostKeyChecking=no", "uname", "-a"},
			"ssh root@10.200.0.10 -o StrictHostKeyChecking=no uname -a"},
		{"pinned host key", acc("", "root", ""), sshOptions{knownHosts: "/c/kh/a1"}, nil,
			"ssh -o UserKnownHostsFile=/c/kh/a1 -o StrictHostKeyChecking=yes root@10.200.0.10"},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, strings.Join(sshArgv(tc.acc, tc.o, tc.extra), " "), tc.name)
	}
	assert.Equal(t, `ssh -i '/tmp/my key' root@10.0.0.1 'echo '\''hi'\'''`, shellJoin([]string{"ssh", "-i", "/tmp/my key", "root@10.0.0.1", "echo 'hi'"}))
}

func TestSliceAccessRefusals(t *testing.T) {
	t.Parallel()
	_, err := sliceAccess(proto.Allocation{ID: "a1", State: proto.AllocProvisioning, Shape: proto.ShapeGPUSlice})
	assert.EqualError(t, err, "allocation a1 is provisioning, not active: it has no SSH access (follow it with: gpuaasctl alloc show a1)")
	_, err = sliceAccess(proto.Allocation{ID: "a1", State: proto.AllocReleased, Shape: proto.ShapeGPUSlice})
	assert.EqualError(t, err, "allocation a1 is released, not active: it has no SSH access (it will not become reachable)")
	_, err = sliceAccess(proto.Allocation{ID: "a2", State: proto.AllocActive, Shape: proto.ShapeBaremetal})
	assert.ErrorContains(t, err, "allocation a2 is a baremetal node with no SSH address recorded")
	_, err = sliceAccess(proto.Allocation{ID: "a3", State: proto.AllocActive, Shape: proto.ShapeGPUSlice})
	assert.EqualError(t, err, "allocation a3 is active but its agent recorded no SSH access for it")
	want := &proto.SliceAccess{GuestIP: "10.200.0.10"}
	got, err := sliceAccess(proto.Allocation{ID: "a4", State: proto.AllocActive, Access: want})
	require.NoError(t, err)
	assert.Same(t, want, got)
	// A deployed baremetal node's recorded address is used, and said to
	// be one without a pinned host key.
	bm := proto.Allocation{ID: "a5", State: proto.AllocActive, Shape: proto.ShapeBaremetal, NodeID: "j27u15",
		SSHPublicKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPuR4dJ6x1t7o9b0b3mO6lq7c1m0m4Zq0qG6Y3m2r2bD t"},
		Access:        &proto.SliceAccess{GuestIP: "10.10.0.2", User: "ubuntu", SSHCommand: "ssh ubuntu@10.10.0.2"}}
	got, err = sliceAccess(bm)
	require.NoError(t, err)
	assert.Equal(t, "ssh ubuntu@10.10.0.2", sshCommand(got))
	assert.Equal(t, []string{"note: baremetal node j27u15 at 10.10.0.2, the address MAAS deployed it with; its host key is not pinned (ssh asks on first use)"}, sshNotes(bm))
	bm.SSHPublicKeys = nil
	notes := sshNotes(bm)
	require.Len(t, notes, 2)
	assert.Contains(t, notes[0], "warning: no key of yours is authorized")
}

// gpuaasctl alloc ssh runs (execs) the ssh on PATH with the access of a
// real allocation made active over the agent protocol: a fake ssh
// records its argv and exits 7, which becomes gpuaasctl's exit status.
func TestCLIAllocSSHExecsSSH(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	agents := []*testAgent{c.enrollAgent(ctx, "us-east-n0000"), c.enrollAgent(ctx, "us-east-n0001")}

	r := c.run(api.RoleOperator, "-o", "json", "alloc", "create", "--gpus", "1", "--region", "us-east").ok(t)
	var al proto.Allocation
	require.NoError(t, json.Unmarshal([]byte(r.out), &al))

	// Not active yet: a clear refusal, no ssh.
	r = c.run(api.RoleViewer, "alloc", "ssh", al.ID)
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "allocation "+al.ID+" is ")
	assert.Contains(t, r.err, "not active: it has no SSH access")

	ag, task := nextTask(t, agents, proto.TaskSliceProvision, map[string]bool{})
	var p proto.AllocationTaskPayload
	require.NoError(t, json.Unmarshal(task.Payload, &p))
	b, err := json.Marshal(proto.SliceProvisionResult{AllocationID: al.ID,
		Access: &proto.SliceAccess{GuestIP: "192.168.122.10", GuestMAC: "52:54:00:aa:00:01", JumpHost: "10.0.0.15", User: "ubuntu",
			SSHCommand: "ssh -J 10.0.0.15 ubuntu@192.168.122.10"},
		Slots: []proto.SlotReadiness{{SlotID: p.Slots[0], HealthState: "ready", Evidence: []string{"ssh ok"}}}})
	require.NoError(t, err)
	ag.send(task.ID, proto.AgentTaskUpdate{State: proto.TaskSucceeded, Result: b})
	require.Eventually(t, func() bool {
		return field(t, c.run(api.RoleViewer, "alloc", "show", al.ID).out, "State") == "active"
	}, 10*time.Second, 50*time.Millisecond)

	r = c.run(api.RoleViewer, "alloc", "ssh", al.ID, "-i", "/tmp/lab key", "--print").ok(t)
	assert.Equal(t, "ssh -i '/tmp/lab key' -J 10.0.0.15 ubuntu@192.168.122.10\n", r.out)

	bin := t.TempDir()
	logf := filepath.Join(t.TempDir(), "argv")
	require.NoError(t, os.WriteFile(filepath.Join(bin, "ssh"),
		[]byte("#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > \"$FAKE_SSH_LOG\"\necho \"pid $$\" >> \"$FAKE_SSH_LOG\"\nexit 7\n"), 0o755))
	var pid int
	run := func(args ...string) (string, int) {
		raw, err := json.Marshal(args)
		require.NoError(t, err)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), runArgsEnv+"="+string(raw), "PATH="+bin, "FAKE_SSH_LOG="+logf,
			"GPUAAS_ADDR="+c.addr, "GPUAAS_CA_FILE="+c.caFile, "GPUAAS_TOKEN="+c.tok[api.RoleViewer])
		out, err := cmd.CombinedOutput()
		pid = cmd.Process.Pid
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		return string(out), code
	}
	out, code := run("alloc", "ssh", al.ID, "-i", "/tmp/lab-key", "--", "-o", "StrictHostKeyChecking=no", "nvidia-smi")
	assert.Equal(t, 7, code, "ssh's exit status is gpuaasctl's: %s", out)
	got, err := os.ReadFile(logf)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(got)), "\n")
	require.Len(t, lines, 10, "%s", got)
	assert.Equal(t, []string{"-i", "/tmp/lab-key", "-J", "10.0.0.15", "ubuntu@192.168.122.10", "-o", "StrictHostKeyChecking=no", "nvidia-smi"}, lines[1:9])
	assert.Equal(t, "ssh", filepath.Base(lines[0]))
	// Replaced, not a child: ssh runs as gpuaasctl's own process.
	assert.Equal(t, fmt.Sprintf("pid %d", pid), lines[9])

	// No ssh on PATH: said so, with the command it would have run.
	require.NoError(t, os.Remove(filepath.Join(bin, "ssh")))
	out, code = run("alloc", "ssh", al.ID)
	assert.Equal(t, ExitError, code)
	assert.Contains(t, out, "ssh is not on PATH (install openssh-client); the command would be: ssh -J 10.0.0.15 ubuntu@192.168.122.10")

	// Usage: the ID is required.
	r = c.run(api.RoleViewer, "alloc", "ssh")
	assert.Equal(t, ExitUsage, r.code, r.err)
}

// The guest's host keys the agent recorded become a known_hosts file of
// the allocation's own; a key that is not an OpenSSH public key (or would
// smuggle a second line in) is refused and nothing is written.
func TestWriteKnownHosts(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	const key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAm2+lVoq4X1mZL6A8ghyLRyT0OAK5m3VVHvbQbWc0Ts"
	path, err := writeKnownHosts("alloc-1", &proto.SliceAccess{GuestIP: "10.200.0.12", HostKeys: []string{key}})
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(cache, "gpuaas", "known_hosts", "alloc-1"), path)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "10.200.0.12 "+key+"\n", string(b))
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	// Released: the pin goes (again: nothing to remove, no error).
	forgetKnownHosts("alloc-1")
	assert.NoFileExists(t, path)
	forgetKnownHosts("alloc-1")

	path, err = writeKnownHosts("alloc-2", &proto.SliceAccess{GuestIP: "10.200.0.12"})
	require.NoError(t, err)
	assert.Empty(t, path, "no key recorded: no file, ssh asks as usual")

	for _, bad := range []string{"not a key", key + "\n* ssh-ed25519 AAAA"} {
		_, err = writeKnownHosts("alloc-3", &proto.SliceAccess{GuestIP: "10.200.0.12", HostKeys: []string{bad}})
		assert.ErrorContains(t, err, "is not an OpenSSH public key")
	}
	assert.NoFileExists(t, filepath.Join(cache, "gpuaas", "known_hosts", "alloc-3"))
}
