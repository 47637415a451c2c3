package leakcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Sources are where Take looks. The zero value of a field means the
// machine's own (see Machine).
type Sources struct {
	Proc      string   // /proc
	SysBlock  string   // /sys/block
	NetnsDir  string   // /run/netns, where `ip netns` keeps named namespaces
	ShmDir    string   // /dev/shm: the gpuaas-* folders in it count
	DomainXML []string // libvirt's persistent and live domain definitions
	OVSDBs    []string // Open vSwitch databases whose bridges count
	// Nft lists the nftables tables ("family name" per table); nil runs
	// `nft list tables`.
	Nft func(ctx context.Context) ([]string, error)
	// Bridges lists the bridges of one OVS database; nil runs ovsdb-tool
	// query on the file (read-only, whether or not ovsdb-server runs).
	Bridges func(ctx context.Context, db string) ([]string, error)
}

// Machine is this machine's sources: the lab's shared userspace Open
// vSwitch database and the distribution's, libvirt's system-instance
// domain folders.
func Machine() Sources {
	return Sources{
		Proc:      "/proc",
		SysBlock:  "/sys/block",
		NetnsDir:  "/run/netns",
		ShmDir:    "/dev/shm",
		DomainXML: []string{"/etc/libvirt/qemu", "/run/libvirt/qemu"},
		OVSDBs:    []string{"/run/gpuaas-ovs/conf.db", "/etc/openvswitch/conf.db", "/var/lib/openvswitch/conf.db"},
	}
}

// Take records what the machine holds now. A collector that fails is
// named in Snapshot.Errors; the others still run.
func Take(ctx context.Context, src Sources) Snapshot {
	s := Snapshot{Errors: map[string]string{}, RunMarker: os.Getenv(RunEnv), TakenEpoch: time.Now().Unix()}
	var err error
	if s.Processes, err = processes(src.Proc); err != nil {
		s.Errors[KindProcess] = err.Error()
	}
	if s.Loops, err = loops(src.SysBlock); err != nil {
		s.Errors[KindLoop] = err.Error()
	}
	if s.Bridges, err = bridges(ctx, src); err != nil {
		s.Errors[KindBridge] = err.Error()
	}
	if s.Domains, err = domains(src.DomainXML); err != nil {
		s.Errors[KindDomain] = err.Error()
	}
	if s.Netns, err = dirNames(src.NetnsDir); err != nil {
		s.Errors[KindNetns] = err.Error()
	}
	if s.Shm, err = shmFolders(src.ShmDir); err != nil {
		s.Errors[KindShm] = err.Error()
	}
	nft := src.Nft
	if nft == nil {
		nft = nftTables
	}
	if s.NftTables, err = nft(ctx); err != nil {
		s.Errors[KindNft] = err.Error()
	}
	if len(s.Errors) == 0 {
		s.Errors = nil
	}
	return s
}

// processes lists the live processes whose program is watched.
func processes(proc string) ([]Process, error) {
	entries, err := os.ReadDir(proc)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var ps []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		// A process may exit while it is read: skip it then.
		cmdline, err := os.ReadFile(filepath.Join(proc, e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 { // kernel threads and zombies have none
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		name := filepath.Base(args[0])
		if !watched(name) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(proc, e.Name(), "stat"))
		if err != nil {
			continue
		}
		state, start, err := parseStat(string(stat))
		if err != nil {
			return nil, fmt.Errorf("process %d: %w", pid, err)
		}
		if state == "Z" || state == "X" {
			continue
		}
		p := Process{Pid: pid, StartTime: start, Name: name, Cmdline: strings.Join(args, " ")}
		if env, err := os.ReadFile(filepath.Join(proc, e.Name(), "environ")); err == nil {
			for _, kv := range strings.Split(string(env), "\x00") {
				if v, ok := strings.CutPrefix(kv, RunEnv+"="); ok {
					p.Run = v
				}
			}
		}
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].Pid < ps[j].Pid })
	return ps, nil
}

// parseStat returns the state and start time of a /proc/<pid>/stat line.
// The comm field is in parentheses and may itself hold spaces and ")", so
// fields are counted after the last ")": state is field 3, starttime 22.
func parseStat(stat string) (string, uint64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return "", 0, fmt.Errorf("stat %q: no \")\" after comm", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 20 {
		return "", 0, fmt.Errorf("stat %q: %d fields after comm, want at least 20", stat, len(f))
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("stat %q: start time %q: %w", stat, f[19], err)
	}
	return f[0], start, nil
}

// loops lists the attached loop devices from sysfs.
func loops(sysBlock string) ([]Loop, error) {
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return nil, fmt.Errorf("list block devices: %w", err)
	}
	var ls []Loop
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(sysBlock, e.Name(), "loop", "backing_file"))
		if errors.Is(err, os.ErrNotExist) {
			continue // not attached
		}
		if err != nil {
			return nil, fmt.Errorf("loop device %s: %w", e.Name(), err)
		}
		ls = append(ls, Loop{Device: e.Name(), Backing: strings.TrimSpace(string(b))})
	}
	sort.Slice(ls, func(i, j int) bool { return ls[i].Device < ls[j].Device })
	return ls, nil
}

func bridges(ctx context.Context, src Sources) ([]Bridge, error) {
	list := src.Bridges
	if list == nil {
		list = ovsdbBridges
	}
	var bs []Bridge
	for _, db := range src.OVSDBs {
		if _, err := os.Stat(db); errors.Is(err, os.ErrNotExist) {
			continue
		}
		names, err := list(ctx, db)
		if err != nil {
			return nil, fmt.Errorf("bridges in %s: %w", db, err)
		}
		for _, n := range names {
			bs = append(bs, Bridge{DB: db, Name: n})
		}
	}
	return bs, nil
}

// ovsdbBridges reads the bridge names from an Open vSwitch database file.
func ovsdbBridges(ctx context.Context, db string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	q := `["Open_vSwitch",{"op":"select","table":"Bridge","where":[],"columns":["name"]}]`
	out, err := exec.CommandContext(ctx, "ovsdb-tool", "query", db, q).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("ovsdb-tool query: %w: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return nil, fmt.Errorf("ovsdb-tool query: %w", err)
	}
	return parseBridgeQuery(out)
}

// parseBridgeQuery reads ovsdb-tool's answer to a select of Bridge names.
func parseBridgeQuery(out []byte) ([]string, error) {
	var res []struct {
		Rows []struct {
			Name string `json:"name"`
		} `json:"rows"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("ovsdb-tool query answer %q: %w", out, err)
	}
	if len(res) != 1 {
		return nil, fmt.Errorf("ovsdb-tool query answer %q: want one result", out)
	}
	if res[0].Error != "" {
		return nil, fmt.Errorf("ovsdb-tool query: %s", res[0].Error)
	}
	var names []string
	for _, r := range res[0].Rows {
		names = append(names, r.Name)
	}
	sort.Strings(names)
	return names, nil
}

// domains lists libvirt domains from their definition files, so it works
// whether or not libvirtd runs: <name>.xml in the persistent folder and in
// the live status folder.
func domains(dirs []string) ([]string, error) {
	set := map[string]bool{}
	for _, d := range dirs {
		entries, err := os.ReadDir(d)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list domains: %w", err)
		}
		for _, e := range entries {
			if n, ok := strings.CutSuffix(e.Name(), ".xml"); ok && !e.IsDir() {
				set[n] = true
			}
		}
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// dirNames lists a folder's entries; a missing folder is empty.
func dirNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

// shmFolders lists the gpuaas-* entries of dir (none without dir).
func shmFolders(dir string) ([]string, error) {
	if dir == "" {
		return nil, nil
	}
	names, err := dirNames(dir)
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, "gpuaas-") {
			out = append(out, filepath.Join(dir, n))
		}
	}
	return out, err
}

// nftTables runs `nft list tables` in the caller's network namespace.
func nftTables(ctx context.Context) ([]string, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, fmt.Errorf("nft is not installed: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nft", "list", "tables").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("nft list tables: %w: %s", err, bytes.TrimSpace(out))
	}
	return parseNftTables(string(out)), nil
}

// parseNftTables reads `nft list tables` output: "table <family> <name>".
func parseNftTables(out string) []string {
	var ts []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "table" {
			ts = append(ts, f[1]+" "+f[2])
		}
	}
	sort.Strings(ts)
	return ts
}
