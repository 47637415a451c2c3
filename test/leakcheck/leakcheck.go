// Package leakcheck finds what a test run left behind on the machine. It
// takes a snapshot of the objects tests start or create — processes of the
// daemons and binaries they run, attached loop devices, Open vSwitch
// bridges, libvirt domains, network namespaces and nftables tables — before
// the run and another after it, and reports what is in the second but not
// the first. What existed before the run is never reported, so a lab or
// another user's daemons running on the machine do not count.
//
// A process is one pid with one start time (a recycled pid is a new
// process). A new process whose environment carries RunEnv with another
// value belongs to another test run (`make test` sets it for its own run)
// and is not reported.
package leakcheck

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
)

// RunEnv is the environment variable naming a test run. `make test`
// exports it, so every process its tests start (and does not strip the
// environment of) carries it.
const RunEnv = "GPUAAS_LEAKCHECK_RUN"

// Process is one process of interest.
type Process struct {
	Pid       int    `json:"pid"`
	StartTime uint64 `json:"start_time"` // clock ticks after boot (/proc/<pid>/stat field 22)
	Name      string `json:"name"`       // program name (argv[0]'s base name)
	Cmdline   string `json:"cmdline"`
	Run       string `json:"run,omitempty"` // RunEnv in its environment, if any
}

func (p Process) key() string { return fmt.Sprintf("%d@%d", p.Pid, p.StartTime) }

// Loop is an attached loop device.
type Loop struct {
	Device  string `json:"device"`  // e.g. loop3
	Backing string `json:"backing"` // backing file
}

func (l Loop) key() string { return l.Device + "=" + l.Backing }

// Bridge is an Open vSwitch bridge recorded in one database.
type Bridge struct {
	DB   string `json:"db"` // conf.db path
	Name string `json:"name"`
}

func (b Bridge) key() string { return b.DB + ":" + b.Name }

// Snapshot is what the machine held at one moment. Errors lists the
// collectors that failed (a missing tool, say): their kind of object is
// then not compared.
type Snapshot struct {
	Processes []Process `json:"processes"`
	Loops     []Loop    `json:"loops"`
	Bridges   []Bridge  `json:"bridges"`
	Domains   []string  `json:"domains"`
	Netns     []string  `json:"netns"`
	NftTables []string  `json:"nft_tables"`
	// Shm are the project's folders on tmpfs (/dev/shm/gpuaas-*: the
	// lab's and the tests' simulated host roots).
	Shm        []string          `json:"shm,omitempty"`
	Errors     map[string]string `json:"errors,omitempty"`
	RunMarker  string            `json:"run,omitempty"` // RunEnv of the run taking the snapshot
	TakenEpoch int64             `json:"taken"`
}

// Kinds of leftovers.
const (
	KindProcess = "process"
	KindLoop    = "loop device"
	KindBridge  = "OVS bridge"
	KindDomain  = "libvirt domain"
	KindNetns   = "network namespace"
	KindNft     = "nftables table"
	KindShm     = "tmpfs folder"
)

// Leak is one object found after the run that was not there before.
type Leak struct {
	Kind   string `json:"kind"`
	What   string `json:"what"`
	Pid    int    `json:"pid,omitempty"` // processes only
	key    string
	Detail string `json:"detail,omitempty"`
}

// maxDetail bounds the detail a report line shows (QEMU's command line
// runs to kilobytes).
const maxDetail = 240

func (l Leak) String() string {
	if l.Detail == "" {
		return l.Kind + " " + l.What
	}
	d := strings.Join(strings.Fields(l.Detail), " ")
	if len(d) > maxDetail {
		d = d[:maxDetail] + "…"
	}
	return l.Kind + " " + l.What + " (" + d + ")"
}

// Diff returns what after holds and before does not, sorted by kind and
// name. Processes of another run (RunEnv set to a value other than
// after.RunMarker, when that is set) are left out, and so is every kind
// whose collector failed in either snapshot.
func Diff(before, after Snapshot) []Leak {
	failed := func(kind string) bool {
		_, a := before.Errors[kind]
		_, b := after.Errors[kind]
		return a || b
	}
	var leaks []Leak
	add := func(kind string, beforeKeys []string, items []Leak) {
		if failed(kind) {
			return
		}
		seen := map[string]bool{}
		for _, k := range beforeKeys {
			seen[k] = true
		}
		for _, it := range items {
			if !seen[it.key] {
				it.Kind = kind
				leaks = append(leaks, it)
			}
		}
	}
	var keys []string
	var items []Leak
	for _, p := range before.Processes {
		keys = append(keys, p.key())
	}
	for _, p := range after.Processes {
		if after.RunMarker != "" && p.Run != "" && p.Run != after.RunMarker {
			continue
		}
		items = append(items, Leak{What: fmt.Sprintf("%s (pid %d)", p.Name, p.Pid), Pid: p.Pid, key: p.key(), Detail: p.Cmdline})
	}
	add(KindProcess, keys, items)

	keys, items = nil, nil
	for _, l := range before.Loops {
		keys = append(keys, l.key())
	}
	for _, l := range after.Loops {
		items = append(items, Leak{What: "/dev/" + l.Device, key: l.key(), Detail: "backing " + l.Backing})
	}
	add(KindLoop, keys, items)

	keys, items = nil, nil
	for _, b := range before.Bridges {
		keys = append(keys, b.key())
	}
	for _, b := range after.Bridges {
		items = append(items, Leak{What: b.Name, key: b.key(), Detail: "in " + b.DB})
	}
	add(KindBridge, keys, items)

	for _, s := range []struct {
		kind          string
		before, after []string
	}{
		{KindDomain, before.Domains, after.Domains},
		{KindNetns, before.Netns, after.Netns},
		{KindNft, before.NftTables, after.NftTables},
		{KindShm, before.Shm, after.Shm},
	} {
		items = nil
		for _, n := range s.after {
			items = append(items, Leak{What: n, key: n})
		}
		add(s.kind, s.before, items)
	}
	sort.SliceStable(leaks, func(i, j int) bool {
		if leaks[i].Kind != leaks[j].Kind {
			return leaks[i].Kind < leaks[j].Kind
		}
		return leaks[i].What < leaks[j].What
	})
	return leaks
}

// Intersect keeps the leaks found in both lists (by kind and identity):
// what a second look, a moment later, still finds. Processes exiting and
// namespaces being deleted as the run ends are not reported.
func Intersect(a, b []Leak) []Leak {
	in := map[string]bool{}
	for _, l := range b {
		in[l.Kind+"\x00"+l.key] = true
	}
	return slices.DeleteFunc(slices.Clone(a), func(l Leak) bool { return !in[l.Kind+"\x00"+l.key] })
}

// Without drops the processes whose pid is in pids (the shared daemons
// another process still uses, say) and returns the rest and the dropped.
func Without(leaks []Leak, pids []int) (kept, dropped []Leak) {
	for _, l := range leaks {
		if l.Kind == KindProcess && slices.Contains(pids, l.Pid) {
			dropped = append(dropped, l)
			continue
		}
		kept = append(kept, l)
	}
	return kept, dropped
}

// Report writes the leaks, one a line, under a heading naming their
// number, and the collectors that failed (their kinds were not checked).
func Report(w io.Writer, leaks []Leak, before, after Snapshot) {
	errs := map[string]string{}
	for k, v := range before.Errors {
		errs[k] = v
	}
	for k, v := range after.Errors {
		errs[k] = v
	}
	kinds := make([]string, 0, len(errs))
	for k := range errs {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(w, "leakcheck: %ss not checked: %s\n", k, errs[k])
	}
	if len(leaks) == 0 {
		fmt.Fprintln(w, "leakcheck: the test run left nothing behind")
		return
	}
	fmt.Fprintf(w, "leakcheck: the test run left %d object(s) behind:\n", len(leaks))
	for _, l := range leaks {
		fmt.Fprintf(w, "  %s\n", l)
	}
}

// Encode writes s as JSON.
func Encode(w io.Writer, s Snapshot) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(s)
}

// Decode reads a snapshot written by Encode.
func Decode(r io.Reader) (Snapshot, error) {
	var s Snapshot
	d := json.NewDecoder(r)
	d.DisallowUnknownFields()
	if err := d.Decode(&s); err != nil {
		return Snapshot{}, fmt.Errorf("leakcheck snapshot: %w", err)
	}
	return s, nil
}

// watched reports whether a program name is one tests start: the daemons
// of the slice runtime, QEMU, and the project's own binaries.
func watched(name string) bool {
	switch name {
	case "ovsdb-server", "ovs-vswitchd", "libvirtd", "virtlogd", "virtlockd", "virtqemud", "dnsmasq", "tini", "udhcpc":
		return true
	}
	// gpuaas-* test binaries (go test's, of the cmd packages) run tests;
	// they are not what tests start.
	return strings.HasPrefix(name, "qemu-system-") || (strings.HasPrefix(name, "gpuaas-") && !strings.HasSuffix(name, ".test"))
}
