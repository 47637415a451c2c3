// Command leakcheck is `make test`'s check that tests leave nothing
// behind: `leakcheck snapshot -o FILE` before the run records the
// machine's processes, loop devices, OVS bridges, libvirt domains, network
// namespaces and nftables tables; `leakcheck check -before FILE` after it
// names what is new and exits 1 if anything is. What was there before is
// ignored; what is new at a first look but gone a moment later (a process
// exiting as the run ends) is not reported.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/lab/labhost"
	"github.com/gpuaas/gpuaas/test/leakcheck"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "leakcheck:", err)
		if errors.Is(err, errLeaks) {
			os.Exit(1)
		}
		os.Exit(2)
	}
}

var errLeaks = errors.New("tests left objects behind (listed above)")

const usage = "usage: leakcheck snapshot -o FILE | leakcheck check -before FILE [-settle DURATION]"

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "snapshot":
		fs := flag.NewFlagSet("snapshot", flag.ContinueOnError)
		path := fs.String("o", "", "file to write the snapshot to")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *path == "" || fs.NArg() != 0 {
			return errors.New(usage)
		}
		f, err := os.Create(*path)
		if err != nil {
			return err
		}
		if err := leakcheck.Encode(f, leakcheck.Take(ctx, leakcheck.Machine())); err != nil {
			f.Close()
			return fmt.Errorf("write %s: %w", *path, err)
		}
		return f.Close()
	case "check":
		fs := flag.NewFlagSet("check", flag.ContinueOnError)
		path := fs.String("before", "", "snapshot taken before the run (leakcheck snapshot -o)")
		settle := fs.Duration("settle", 3*time.Second, "how long to wait before looking again at what is new")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *path == "" || fs.NArg() != 0 || *settle < 0 {
			return errors.New(usage)
		}
		f, err := os.Open(*path)
		if err != nil {
			return err
		}
		before, err := leakcheck.Decode(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", *path, err)
		}
		after := leakcheck.Take(ctx, leakcheck.Machine())
		leaks := leakcheck.Diff(before, after)
		if len(leaks) > 0 && *settle > 0 {
			time.Sleep(*settle)
			after = leakcheck.Take(ctx, leakcheck.Machine())
			leaks = leakcheck.Intersect(leaks, leakcheck.Diff(before, after))
		}
		// The shared daemon set (lab/labhost) is stopped by make
		// clean-daemons before this check, unless a lab or another test
		// run still uses it: then it is theirs to stop.
		if users := labhost.Users(); len(users) > 0 {
			var dropped []leakcheck.Leak
			leaks, dropped = leakcheck.Without(leaks, sharedPids())
			for _, l := range dropped {
				fmt.Fprintf(out, "leakcheck: %s left running: the shared daemons are in use by %s\n", l, strings.Join(users, ", "))
			}
		}
		leakcheck.Report(out, leaks, before, after)
		if len(leaks) > 0 {
			return errLeaks
		}
		return nil
	default:
		return fmt.Errorf("unknown command %q; %s", args[0], usage)
	}
}

// sharedPids returns the pids of the running shared daemons and of the
// reaper (tini) libvirtd runs under.
func sharedPids() []int {
	var pids []int
	for _, d := range labhost.Shared() {
		if d.Pid == 0 {
			continue
		}
		pids = append(pids, d.Pid)
		if d.Name != "libvirtd" {
			continue
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(d.Pid) + "/stat")
		if err != nil {
			continue
		}
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 {
			if f := strings.Fields(string(b)[i+1:]); len(f) > 1 {
				if ppid, err := strconv.Atoi(f[1]); err == nil && ppid > 1 {
					if comm, _ := os.ReadFile("/proc/" + f[1] + "/comm"); strings.TrimSpace(string(comm)) == "tini" {
						pids = append(pids, ppid)
					}
				}
			}
		}
	}
	return pids
}
