package leakcheck

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func proc(pid int, start uint64, name, run string) Process {
	return Process{Pid: pid, StartTime: start, Name: name, Cmdline: name + " --flag", Run: run}
}

func whats(leaks []Leak) []string {
	var s []string
	for _, l := range leaks {
		s = append(s, l.Kind+": "+l.What)
	}
	return s
}

func TestDiff(t *testing.T) {
	base := Snapshot{
		Processes: []Process{proc(10, 100, "libvirtd", ""), proc(11, 101, "ovsdb-server", "")},
		Loops:     []Loop{{Device: "loop0", Backing: "/lab/disks/nvme0n1.img"}},
		Bridges:   []Bridge{{DB: "/run/gpuaas-ovs/conf.db", Name: "gpl8577"}},
		Domains:   []string{"lab-guest"},
		Netns:     []string{"other"},
		NftTables: []string{"inet gpuaas"},
	}
	for _, tc := range []struct {
		name  string
		after func(s *Snapshot)
		want  []string
	}{
		{"nothing new", func(*Snapshot) {}, nil},
		{"only gone", func(s *Snapshot) { s.Processes, s.Loops, s.Netns = nil, nil, nil }, nil},
		{"every kind new", func(s *Snapshot) {
			s.Processes = append(s.Processes, proc(20, 200, "dnsmasq", ""), proc(21, 201, "qemu-system-x86_64", "run1"))
			s.Loops = append(s.Loops, Loop{Device: "loop1", Backing: "/tmp/x/disk.img"})
			s.Bridges = append(s.Bridges, Bridge{DB: "/run/gpuaas-ovs/conf.db", Name: "gps1a2b"})
			s.Domains = append(s.Domains, "gpuaas-a1")
			s.Netns = append(s.Netns, "gpn-sw-1a2b3c")
			s.NftTables = append(s.NftTables, "inet gpt1a2b")
		}, []string{
			"OVS bridge: gps1a2b", "libvirt domain: gpuaas-a1", "loop device: /dev/loop1", "network namespace: gpn-sw-1a2b3c",
			"nftables table: inet gpt1a2b", "process: dnsmasq (pid 20)", "process: qemu-system-x86_64 (pid 21)",
		}},
		{"a recycled pid is a new process", func(s *Snapshot) {
			s.Processes = []Process{proc(10, 999, "libvirtd", ""), proc(11, 101, "ovsdb-server", "")}
		}, []string{"process: libvirtd (pid 10)"}},
		{"a loop device re-attached to another file is new", func(s *Snapshot) {
			s.Loops = []Loop{{Device: "loop0", Backing: "/tmp/y/disk.img"}}
		}, []string{"loop device: /dev/loop0"}},
		{"the same bridge name in another database is new", func(s *Snapshot) {
			s.Bridges = append(s.Bridges, Bridge{DB: "/etc/openvswitch/conf.db", Name: "gpl8577"})
		}, []string{"OVS bridge: gpl8577"}},
		{"another run's process is not ours", func(s *Snapshot) {
			s.RunMarker = "run1"
			s.Processes = append(s.Processes, proc(30, 300, "dnsmasq", "run2"), proc(31, 301, "ovs-vswitchd", "run1"), proc(32, 302, "qemu-system-x86_64", ""))
		}, []string{"process: ovs-vswitchd (pid 31)", "process: qemu-system-x86_64 (pid 32)"}},
		{"a failed collector's kind is not compared", func(s *Snapshot) {
			s.Errors = map[string]string{KindNetns: "permission denied"}
			s.Netns = append(s.Netns, "gpn-x")
			s.Domains = append(s.Domains, "gpuaas-b")
		}, []string{"libvirt domain: gpuaas-b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			after := base
			after.Processes = append([]Process(nil), base.Processes...)
			after.Loops = append([]Loop(nil), base.Loops...)
			after.Bridges = append([]Bridge(nil), base.Bridges...)
			after.Domains = append([]string(nil), base.Domains...)
			after.Netns = append([]string(nil), base.Netns...)
			after.NftTables = append([]string(nil), base.NftTables...)
			tc.after(&after)
			leaks := Diff(base, after)
			require.Equal(t, tc.want, whats(leaks))
			for _, l := range leaks {
				if l.Kind == KindProcess {
					require.NotZero(t, l.Pid, l.What)
				}
			}
		})
	}
	// A kind whose collector failed before the run is not compared either.
	before := base
	before.Errors = map[string]string{KindProcess: "no /proc"}
	after := base
	after.Processes = []Process{proc(40, 400, "dnsmasq", "")}
	require.Empty(t, Diff(before, after))
}

func TestIntersect(t *testing.T) {
	first := []Leak{{Kind: KindProcess, What: "dnsmasq (pid 5)", key: "5@1"}, {Kind: KindNetns, What: "gpn-a", key: "gpn-a"}, {Kind: KindLoop, What: "/dev/loop2", key: "loop2=/x"}}
	second := []Leak{{Kind: KindNetns, What: "gpn-a", key: "gpn-a"}, {Kind: KindProcess, What: "dnsmasq (pid 5)", key: "5@2"}, {Kind: KindLoop, What: "/dev/loop2", key: "loop2=/x"}}
	require.Equal(t, []string{"network namespace: gpn-a", "loop device: /dev/loop2"}, whats(Intersect(first, second)))
	require.Empty(t, Intersect(first, nil))
}

func TestWithout(t *testing.T) {
	leaks := []Leak{{Kind: KindProcess, What: "libvirtd (pid 5)", Pid: 5}, {Kind: KindProcess, What: "dnsmasq (pid 6)", Pid: 6}, {Kind: KindNetns, What: "gpn-a"}}
	kept, dropped := Without(leaks, []int{5, 7})
	require.Equal(t, []string{"process: dnsmasq (pid 6)", "network namespace: gpn-a"}, whats(kept))
	require.Equal(t, []string{"process: libvirtd (pid 5)"}, whats(dropped))
	kept, dropped = Without(leaks, nil)
	require.Equal(t, leaks, kept)
	require.Empty(t, dropped)
}

func TestReport(t *testing.T) {
	var b bytes.Buffer
	Report(&b, nil, Snapshot{}, Snapshot{Errors: map[string]string{KindNft: "nft is not installed"}})
	require.Equal(t, "leakcheck: nftables tables not checked: nft is not installed\nleakcheck: the test run left nothing behind\n", b.String())
	b.Reset()
	Report(&b, []Leak{{Kind: KindProcess, What: "dnsmasq (pid 5)", Detail: "dnsmasq --keep-in-foreground"}, {Kind: KindNetns, What: "gpn-a"}}, Snapshot{}, Snapshot{})
	require.Equal(t, "leakcheck: the test run left 2 object(s) behind:\n  process dnsmasq (pid 5) (dnsmasq --keep-in-foreground)\n  network namespace gpn-a\n", b.String())
}

func TestLeakString(t *testing.T) {
	long := Leak{Kind: KindProcess, What: "qemu-system-x86_64 (pid 9)", Detail: "qemu -fw_cfg name=gpu0,string=a\nb  " + strings.Repeat("x", 300)}
	s := long.String()
	require.NotContains(t, s, "\n")
	require.Contains(t, s, "string=a b x")
	require.True(t, strings.HasSuffix(s, "…)"), s)
	require.Less(t, len(s), 300)
}

func TestEncodeDecode(t *testing.T) {
	s := Snapshot{Processes: []Process{proc(1, 2, "tini", "r")}, Loops: []Loop{{Device: "loop0", Backing: "/f"}}, Netns: []string{"n"}, RunMarker: "r", TakenEpoch: 7}
	var b bytes.Buffer
	require.NoError(t, Encode(&b, s))
	got, err := Decode(&b)
	require.NoError(t, err)
	require.Equal(t, s, got)
	_, err = Decode(strings.NewReader(`{"procs": []}`))
	require.ErrorContains(t, err, `unknown field "procs"`)
	_, err = Decode(strings.NewReader(`not json`))
	require.ErrorContains(t, err, "leakcheck snapshot")
}

func TestParseStat(t *testing.T) {
	tail := " 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 123456 1 2"
	for _, tc := range []struct {
		name, stat, state string
		start             uint64
		err               string
	}{
		{"plain", "42 (dnsmasq) S 1" + tail, "S", 123456, ""},
		{"comm with spaces and parens", "42 (a b) c)) Z 1" + tail, "Z", 123456, ""},
		{"no comm", "42 dnsmasq S 1" + tail, "", 0, `no ")"`},
		{"truncated", "42 (dnsmasq) S 1 0 0", "", 0, "want at least 20"},
		{"bad start time", "42 (dnsmasq) S 1" + strings.Replace(tail, "123456", "x", 1), "", 0, "start time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, start, err := parseStat(tc.stat)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.state, state)
			require.Equal(t, tc.start, start)
		})
	}
}

func TestParseBridgeQuery(t *testing.T) {
	names, err := parseBridgeQuery([]byte(`[{"rows":[{"name":"gpl8577"},{"name":"br0"}]}]`))
	require.NoError(t, err)
	require.Equal(t, []string{"br0", "gpl8577"}, names)
	names, err = parseBridgeQuery([]byte(`[{"rows":[]}]`))
	require.NoError(t, err)
	require.Empty(t, names)
	_, err = parseBridgeQuery([]byte(`[{"error":"syntax error","details":"x"}]`))
	require.ErrorContains(t, err, "syntax error")
	_, err = parseBridgeQuery([]byte(`[]`))
	require.ErrorContains(t, err, "want one result")
	_, err = parseBridgeQuery([]byte(`ovsdb-tool: I/O error`))
	require.Error(t, err)
}

func TestParseNftTables(t *testing.T) {
	require.Equal(t, []string{"inet gpuaas", "ip nat"}, parseNftTables("table ip nat\ntable inet gpuaas\n\nwarning: x\n"))
	require.Empty(t, parseNftTables(""))
}

func write(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
}

// Take reads a simulated /proc, /sys/block, netns folder and libvirt
// folders, and names the collectors that failed.
func TestTake(t *testing.T) {
	dir := t.TempDir()
	stat := func(pid, state string) string {
		return pid + " (x) " + state + " 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 " + pid + "00 1 2"
	}
	p := filepath.Join(dir, "proc")
	write(t, filepath.Join(p, "100", "cmdline"), "/usr/sbin/dnsmasq\x00--keep-in-foreground\x00")
	write(t, filepath.Join(p, "100", "stat"), stat("100", "S"))
	write(t, filepath.Join(p, "100", "environ"), "PATH=/bin\x00"+RunEnv+"=run7\x00")
	write(t, filepath.Join(p, "101", "cmdline"), "/tmp/b/gpuaas-coordinator\x00-node-id\x00c1\x00")
	write(t, filepath.Join(p, "101", "stat"), stat("101", "S"))
	write(t, filepath.Join(p, "102", "cmdline"), "bash\x00")
	write(t, filepath.Join(p, "102", "stat"), stat("102", "S"))
	write(t, filepath.Join(p, "103", "cmdline"), "") // kernel thread or zombie
	write(t, filepath.Join(p, "103", "stat"), stat("103", "Z"))
	write(t, filepath.Join(p, "104", "cmdline"), "qemu-system-x86_64\x00")
	write(t, filepath.Join(p, "104", "stat"), stat("104", "Z"))
	write(t, filepath.Join(p, "105", "cmdline"), "/tmp/go-build1/b1/gpuaas-coordinator.test\x00-test.count=1\x00")
	write(t, filepath.Join(p, "105", "stat"), stat("105", "S"))
	write(t, filepath.Join(p, "self", "cmdline"), "leakcheck\x00")
	sys := filepath.Join(dir, "sys")
	write(t, filepath.Join(sys, "loop0", "loop", "backing_file"), "/tmp/d/nvme0n1.img\n")
	require.NoError(t, os.MkdirAll(filepath.Join(sys, "loop1"), 0o755)) // detached
	require.NoError(t, os.MkdirAll(filepath.Join(sys, "sda"), 0o755))
	ns := filepath.Join(dir, "netns")
	write(t, filepath.Join(ns, "gpn-sw-1a2b3c"), "")
	write(t, filepath.Join(dir, "etc-qemu", "gpuaas-a1.xml"), "<domain/>")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "etc-qemu", "networks"), 0o755))
	write(t, filepath.Join(dir, "run-qemu", "gpuaas-a1.xml"), "<domstatus/>")
	write(t, filepath.Join(dir, "run-qemu", "gpuaas-a2.xml"), "<domstatus/>")
	write(t, filepath.Join(dir, "run-qemu", "driver.pid"), "5")
	shm := filepath.Join(dir, "shm")
	require.NoError(t, os.MkdirAll(filepath.Join(shm, "gpuaas-lab-1a2b3c", "j22u15"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(shm, "someone-else"), 0o755))
	db := filepath.Join(dir, "conf.db")
	write(t, db, "")
	src := Sources{Proc: p, SysBlock: sys, NetnsDir: ns, ShmDir: shm, DomainXML: []string{filepath.Join(dir, "etc-qemu"), filepath.Join(dir, "run-qemu"), filepath.Join(dir, "absent")},
		OVSDBs: []string{db, filepath.Join(dir, "absent.db")},
		Bridges: func(_ context.Context, got string) ([]string, error) {
			require.Equal(t, db, got, "only databases that exist are read")
			return []string{"gps1"}, nil
		},
		Nft: func(context.Context) ([]string, error) { return nil, errors.New("nft is not installed") },
	}
	t.Setenv(RunEnv, "run7")
	s := Take(context.Background(), src)
	require.Equal(t, []Process{
		{Pid: 100, StartTime: 10000, Name: "dnsmasq", Cmdline: "/usr/sbin/dnsmasq --keep-in-foreground", Run: "run7"},
		{Pid: 101, StartTime: 10100, Name: "gpuaas-coordinator", Cmdline: "/tmp/b/gpuaas-coordinator -node-id c1"},
	}, s.Processes)
	require.Equal(t, []Loop{{Device: "loop0", Backing: "/tmp/d/nvme0n1.img"}}, s.Loops)
	require.Equal(t, []Bridge{{DB: db, Name: "gps1"}}, s.Bridges)
	require.Equal(t, []string{"gpuaas-a1", "gpuaas-a2"}, s.Domains)
	require.Equal(t, []string{"gpn-sw-1a2b3c"}, s.Netns)
	require.Equal(t, []string{filepath.Join(shm, "gpuaas-lab-1a2b3c")}, s.Shm, "the project's tmpfs folders only")
	leaks := Diff(Snapshot{}, Snapshot{Shm: s.Shm})
	require.Len(t, leaks, 1)
	require.Equal(t, KindShm, leaks[0].Kind)
	require.Empty(t, s.NftTables)
	require.Equal(t, map[string]string{KindNft: "nft is not installed"}, s.Errors)
	require.Equal(t, "run7", s.RunMarker)

	// A missing /proc is an error of its kind only.
	src.Proc = filepath.Join(dir, "absent")
	s = Take(context.Background(), src)
	require.Contains(t, s.Errors[KindProcess], "list processes")
	require.Len(t, s.Loops, 1)
}
