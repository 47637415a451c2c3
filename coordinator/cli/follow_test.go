package cli

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

var update = flag.Bool("update", false, "rewrite the golden files of the renderers")

// golden compares got with testdata/name (rewritten with -update).
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "golden file (run go test -run %s -update once)", t.Name())
	assert.Equal(t, string(want), got)
}

var t0 = time.Date(2026, 11, 21, 22, 0, 0, 0, time.UTC)

// timeline builds events from (offset ms, stage, status, message).
type ev struct {
	ms                 int
	stage, status, msg string
}

func timeline(id string, evs ...ev) []proto.TimelineEvent {
	out := make([]proto.TimelineEvent, len(evs))
	for i, e := range evs {
		out[i] = proto.TimelineEvent{AllocationID: id, Seq: uint64(i + 1), Stage: e.stage, Status: e.status, Message: e.msg,
			At: t0.Add(time.Duration(e.ms) * time.Millisecond)}
	}
	return out
}

// provisionEvents is a slice provision as the agent reports it.
func provisionEvents(id string) []proto.TimelineEvent {
	return timeline(id,
		ev{0, "placement", "succeeded", "placed on node j22u15 slots j22u15-s0"},
		ev{40, "plan", "started", ""}, ev{95, "plan", "succeeded", ""},
		ev{100, "provisioning", "started", ""},
		ev{110, "image", "started", ""}, ev{520, "image", "succeeded", "sha256:9f2c verified"},
		ev{530, "disk_check", "started", ""}, ev{560, "disk_check", "succeeded", ""},
		ev{600, "clone", "started", "64.0 MiB"}, ev{3800, "clone", "succeeded", ""},
		ev{3810, "seed", "started", ""}, ev{3850, "seed", "succeeded", ""},
		ev{3860, "define_start", "started", ""}, ev{4300, "define_start", "succeeded", ""},
		ev{4310, "dhcp_lease", "started", ""}, ev{17200, "dhcp_lease", "succeeded", "52:54:00:aa:00:01=192.168.122.10"},
		ev{17210, "ssh_ready", "started", ""}, ev{19900, "ssh_ready", "succeeded", ""},
		ev{19950, "active", "succeeded", ""},
	)
}

// The live view of a provision: stage lines arrive in batches as the
// blocking query wakes, the clone shows plain progress lines (stdout is
// not a terminal) with rate and ETA, and the end prints the SSH command.
func TestFollowRenderActive(t *testing.T) {
	t.Parallel()
	all := provisionEvents("a-1")
	task := func(stage string, done, total int64) *proto.Task {
		return &proto.Task{ID: "t-1", Type: proto.TaskSliceProvision, State: proto.TaskRunning, Stage: stage, Done: done, Total: total}
	}
	var out bytes.Buffer
	f := newFollower(&out, false)
	f.Observe(all[:1], &proto.Task{ID: "t-1", State: proto.TaskQueued}, t0)
	f.Observe(all[:4], task("plan", 0, 0), t0.Add(100*time.Millisecond))
	f.Observe(all[:9], task("clone", 0, 64<<20), t0.Add(600*time.Millisecond))
	f.Observe(all[:9], task("clone", 16<<20, 64<<20), t0.Add(1600*time.Millisecond))
	f.Observe(all[:9], task("clone", 16<<20, 64<<20), t0.Add(1700*time.Millisecond)) // unchanged: no line
	f.Observe(all[:9], task("clone", 48<<20, 64<<20), t0.Add(3600*time.Millisecond))
	f.Observe(all[:11], task("seed", 0, 0), t0.Add(3810*time.Millisecond))
	f.Observe(all[:18], task("ssh_ready", 0, 0), t0.Add(19900*time.Millisecond))
	f.Observe(all, &proto.Task{ID: "t-1", State: proto.TaskSucceeded, Stage: "ssh_ready"}, t0.Add(19950*time.Millisecond))
	al := proto.Allocation{ID: "a-1", State: proto.AllocActive, SSHPublicKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPuR4dJ6x1t7o9b0b3mO6lq7c1m0m4Zq0qG6Y3m2r2bD t"}, Access: &proto.SliceAccess{GuestIP: "192.168.122.10", GuestMAC: "52:54:00:aa:00:01",
		JumpHost: "10.0.0.15", User: "root"}}
	msg, err := outcome(al, all, f.view.Elapsed(t0.Add(19950*time.Millisecond)))
	require.NoError(t, err)
	out.WriteString(msg + "\n")
	golden(t, "follow_active.golden", out.String())
	assert.Contains(t, out.String(), "ssh: ssh -J root@10.0.0.15 root@192.168.122.10")
}

func TestFollowRenderFailure(t *testing.T) {
	t.Parallel()
	evs := timeline("a-2",
		ev{0, "placement", "succeeded", "placed on node j22u15 slots j22u15-s0,j22u15-s1"},
		ev{50, "plan", "succeeded", ""},
		ev{60, "provisioning", "started", ""},
		ev{70, "clone", "started", ""},
		ev{1270, "clone", "failed", "short write on /dev/nvme1n1"},
		ev{1300, "failed", "failed", "stage clone failed: short write on /dev/nvme1n1"},
	)
	var out bytes.Buffer
	f := newFollower(&out, false)
	f.Observe(evs[:4], &proto.Task{State: proto.TaskRunning, Stage: "clone", Done: 1 << 20, Total: 4 << 20}, t0.Add(80*time.Millisecond))
	f.Observe(evs, &proto.Task{State: proto.TaskFailed, Stage: "clone", Done: 2 << 20, Total: 4 << 20}, t0.Add(1300*time.Millisecond))
	_, err := outcome(proto.Allocation{ID: "a-2", State: proto.AllocFailed, Reason: "stage clone failed: short write on /dev/nvme1n1"}, evs, 0)
	require.Error(t, err)
	out.WriteString("Error: " + err.Error() + "\n")
	golden(t, "follow_failed.golden", out.String())
}

func TestTimelineRowsGolden(t *testing.T) {
	t.Parallel()
	evs := append(provisionEvents("a-1"), timeline("a-1",
		ev{60000, "release", "started", ""},
		ev{60010, "stop", "started", ""}, ev{65100, "stop", "succeeded", "graceful"},
		ev{65110, "net_cleanup", "started", ""}, ev{65200, "net_cleanup", "succeeded", ""},
		ev{65210, "wipe", "started", ""}, ev{192000, "wipe", "succeeded", "zero 64.0 MiB verified"},
		ev{192050, "release", "succeeded", ""})...)
	for i := range evs {
		evs[i].Seq = uint64(i + 1)
	}
	var out bytes.Buffer
	w := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
	row(w, "SEQ", "AT", "STAGE", "STATUS", "DURATION", "MESSAGE")
	for _, cells := range timelineRows(evs) {
		row(w, cells[0], cells[1], cells[2], cells[3], cells[4], cells[5])
	}
	require.NoError(t, w.Flush())
	golden(t, "timeline.golden", out.String())
	requireAligned(t, out.String())
}

func TestProgressLineAndDurations(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		done, total int64
		rate        float64
		want        string
	}{
		{0, 64 << 20, 0, "clone         0 B / 64.0 MiB (  0%)"},
		{16 << 20, 64 << 20, 16 << 20, "clone         16.0 MiB / 64.0 MiB ( 25%)  16.0 MiB/s  ETA 3.0s"},
		{3 << 40, 4 << 40, 1 << 30, "clone         3.0 TiB / 4.0 TiB ( 75%)  1.0 GiB/s  ETA 17m04s"},
	} {
		assert.Equal(t, tc.want, progressLine("clone", tc.done, tc.total, tc.rate))
	}
	assert.Equal(t, "350ms", fmtDuration(350*time.Millisecond))
	assert.Equal(t, "12.9s", fmtDuration(12900*time.Millisecond))
	assert.Equal(t, "2m07s", fmtDuration(127*time.Second))
	assert.Equal(t, "-", fmtDuration(-time.Second))
	assert.Equal(t, "", strings.TrimSpace(progressText(1, 0)))
}

// On a terminal the clone shows a progress bar (rate and ETA from
// progressbar/v3), ended before the next stage line.
func TestFollowTerminalBar(t *testing.T) {
	t.Parallel()
	evs := provisionEvents("a-1")
	var out bytes.Buffer
	f := newFollower(&out, true)
	f.Observe(evs[:9], &proto.Task{State: proto.TaskRunning, Stage: "clone", Done: 8 << 20, Total: 64 << 20}, t0)
	time.Sleep(150 * time.Millisecond) // past the bar's render throttle
	f.Observe(evs[:9], &proto.Task{State: proto.TaskRunning, Stage: "clone", Done: 32 << 20, Total: 64 << 20}, t0.Add(time.Second))
	f.Observe(evs[:11], &proto.Task{State: proto.TaskRunning, Stage: "seed"}, t0.Add(2*time.Second))
	s := out.String()
	assert.Contains(t, s, "clone")
	assert.Contains(t, s, "MB", "the bar shows bytes")
	assert.Contains(t, s, "clone         succeeded     3.2s")
	assert.Less(t, strings.LastIndex(s, "MB"), strings.Index(s, "clone         succeeded"), "the bar ends before the stage line")
}

// A baremetal handoff as the coordinator mirrors it from the MAAS
// workflow: one line per MAAS bucket, then active with the SSH command;
// a followed release shows its own stages only.
func TestFollowRenderBaremetal(t *testing.T) {
	t.Parallel()
	evs := timeline("a-bm",
		ev{0, "placement", "succeeded", "placed on node j27u15"},
		ev{5, "provisioning", "started", "MAAS handoff workflow handoff.t-1 deploys j27u15 for the tenant"},
		ev{6, "maas.ready_to_deploy_wait", "started", "MAAS handoff of j27u15 (workflow handoff.t-1)"},
		ev{20, "maas.ready_to_deploy_wait", "succeeded", "machine s3sme8"},
		ev{21, "maas.image_deploy", "started", "MAAS handoff of j27u15 (workflow handoff.t-1)"},
		ev{1250, "maas.image_deploy", "succeeded", "machine s3sme8"},
		ev{1260, "active", "succeeded", ""},
		ev{9000, "release", "started", ""},
		ev{9001, "maas.release_erase", "started", "MAAS release with erase of j27u15 (workflow reclaim.t-2)"},
		ev{9400, "maas.release_erase", "succeeded", "machine s3sme8 erased, Ready"},
		ev{9420, "release", "succeeded", ""},
	)
	var out bytes.Buffer
	f := newFollower(&out, false)
	f.Observe(evs[:4], &proto.Task{ID: "t-1", Type: proto.TaskBaremetalHandoff, State: proto.TaskRunning, Stage: "maas.ready_to_deploy_wait"}, t0)
	f.Observe(evs[:7], &proto.Task{ID: "t-1", Type: proto.TaskBaremetalHandoff, State: proto.TaskSucceeded}, t0.Add(1260*time.Millisecond))
	al := proto.Allocation{ID: "a-bm", State: proto.AllocActive, SSHPublicKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPuR4dJ6x1t7o9b0b3mO6lq7c1m0m4Zq0qG6Y3m2r2bD t"}, Access: &proto.SliceAccess{GuestIP: "10.10.0.2", GuestMAC: "52:54:00:27:15:01",
		User: "ubuntu", SSHCommand: "ssh ubuntu@10.10.0.2"}}
	msg, err := outcome(al, evs[:7], f.view.Elapsed(t0.Add(1260*time.Millisecond)))
	require.NoError(t, err)
	out.WriteString(msg + "\n")

	rel := newFollower(&out, false)
	rel.view.seen = releaseStart(evs)
	assert.Equal(t, uint64(7), rel.view.seen, "the release's own events start after the active one")
	rel.Observe(evs, &proto.Task{ID: "t-2", Type: proto.TaskBaremetalRelease, State: proto.TaskSucceeded}, t0.Add(9420*time.Millisecond))
	out.WriteString(releaseOutcome(proto.Allocation{ID: "a-bm", State: proto.AllocReleased}, rel.view.Elapsed(t0.Add(9420*time.Millisecond))) + "\n")
	golden(t, "follow_baremetal.golden", out.String())
	assert.Contains(t, out.String(), "maas.image_deploy succeeded     1.2s  machine s3sme8")
	assert.Contains(t, out.String(), "ssh: ssh ubuntu@10.10.0.2")
	assert.NotContains(t, strings.SplitN(out.String(), "ssh: ", 2)[1], "placement", "the release view starts at the release")
	assert.Contains(t, out.String(), "allocation a-bm is released after 420ms")
}

// --wait prints the command alloc ssh --print gives: a jump host that is
// this machine (the lab's) is dropped.
func TestOutcomeSSHMatchesAllocSSH(t *testing.T) {
	for _, jump := range []string{"127.0.0.1", "10.0.0.15"} {
		acc := &proto.SliceAccess{GuestIP: "10.200.0.10", JumpHost: jump, User: "root"}
		msg, err := outcome(proto.Allocation{ID: "a-1", State: proto.AllocActive, Access: acc}, nil, time.Second)
		require.NoError(t, err)
		want := shellJoin(sshArgv(acc, sshOptions{}, nil))
		assert.Contains(t, msg, "\nssh: "+want+"", jump)
		if jump == "127.0.0.1" {
			assert.NotContains(t, msg, "-J", "a loopback jump host is dropped")
		}
		// alloc show prints the same command.
		var b bytes.Buffer
		w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		allocDetail(w, proto.Allocation{ID: "a-1", State: proto.AllocActive, Access: acc})
		require.NoError(t, w.Flush())
		assert.Regexp(t, `(?m)^SSH:\s+`+regexp.QuoteMeta(want)+`$`, b.String(), jump)
	}
}

// An allocation created without --ssh-key is reachable by no key of the
// caller's: create --wait, show and ssh say so and how a key is given.
func TestNoSSHKeySaysSo(t *testing.T) {
	acc := &proto.SliceAccess{GuestIP: "10.200.0.10", JumpHost: "127.0.0.1", User: "root"}
	al := proto.Allocation{ID: "a-1", State: proto.AllocActive, Access: acc}
	msg, err := outcome(al, nil, time.Second)
	require.NoError(t, err)
	assert.Contains(t, msg, "\nssh: ssh root@10.200.0.10\n")
	assert.Contains(t, msg, "no key of yours is authorized: the allocation was created without --ssh-key")
	assert.Contains(t, msg, "--ssh-key")
	var b bytes.Buffer
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	allocDetail(w, al)
	require.NoError(t, w.Flush())
	assert.Regexp(t, `(?m)^SSH keys:\s+no key of yours is authorized`, b.String())

	al.SSHPublicKeys = []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPuR4dJ6x1t7o9b0b3mO6lq7c1m0m4Zq0qG6Y3m2r2bD t"}
	msg, err = outcome(al, nil, time.Second)
	require.NoError(t, err)
	assert.NotContains(t, msg, "no key of yours")
	b.Reset()
	allocDetail(w, al)
	require.NoError(t, w.Flush())
	assert.NotContains(t, b.String(), "SSH keys:")
}
