package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/proto"
)

// labDirFlag parses the -dir flag of a subcommand.
func labDirFlag(name string, args []string, extra func(*flag.FlagSet)) (string, error) {
	fs := flag.NewFlagSet("gpuaas-lab "+name, flag.ContinueOnError)
	dir := fs.String("dir", envOr("GPUAAS_LAB_DIR", ".lab"), "lab folder")
	if extra != nil {
		extra(fs)
	}
	if err := fs.Parse(args); err != nil {
		return "", err
	}
	if fs.NArg() > 0 {
		return "", fmt.Errorf("gpuaas-lab %s: unexpected argument %q", name, fs.Arg(0))
	}
	return filepath.Abs(*dir)
}

// runStatus prints whether the lab of a folder runs: the gpuaas-lab
// process, each coordinator (pid, readiness, leader) and agent (pid),
// and the nodes with their readiness. It fails when the lab is not
// running or one of its processes is down.
func runStatus(args []string, out io.Writer) error {
	dir, err := labDirFlag("status", args, nil)
	if err != nil {
		return err
	}
	st, err := readState(dir)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("no lab in %s (no lab.json): start one with make lab (or bin/gpuaas-lab -dir %s)", dir, dir)
	}
	if err != nil {
		return err
	}
	ri, err := readRunInfo(dir)
	if errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(out, "lab %s: not running (no gpuaas-lab recorded; it stopped cleanly or never started)\n", dir)
		return fmt.Errorf("the lab in %s is not running", dir)
	}
	if err != nil {
		return err
	}
	var down []string
	if labAlive(ri) {
		fmt.Fprintf(out, "lab %s: running (gpuaas-lab pid %d, since %s, %s)\n", dir, ri.PID, ri.Started.Local().Format(time.DateTime), ri.Phase)
	} else {
		fmt.Fprintf(out, "lab %s: NOT running: gpuaas-lab pid %d is gone without stopping its processes (killed?)\n", dir, ri.PID)
		down = append(down, "gpuaas-lab")
	}
	if ri.SliceHost != nil {
		fmt.Fprintf(out, "slice host: %s\n", ri.SliceHost.describe())
	}
	if err := launch.WriteBundle(dir); err != nil {
		fmt.Fprintf(out, "lab CA bundle: %v\n", err)
	}
	if hc, err := launch.HTTPClient(dir); err == nil {
		labHTTP = hc
	} else {
		fmt.Fprintf(out, "lab CA: %v\n", err)
	}
	token := ""
	if b, err := os.ReadFile(filepath.Join(dir, "tokens.secret.json")); err == nil {
		var t tokens
		if json.Unmarshal(b, &t) == nil {
			token = t.Viewer
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fmt.Fprintf(out, "\ncoordinators:\n")
	api := ""
	for _, c := range st.Coordinators {
		pid := ri.Coordinators[c.ID]
		alive := procAlive(pid, "gpuaas-coordinator")
		line := fmt.Sprintf("  %-3s pid %-7d %-5s API https://%s", c.ID, pid, aliveWord(alive), c.HTTP)
		if !alive {
			down = append(down, c.ID)
			fmt.Fprintln(out, line)
			continue
		}
		line += "  " + probeReady(ctx, c.HTTP)
		var s proto.Status
		if err := getJSON(ctx, launch.APIURL(c.HTTP)+"/v1/status", token, &s); err == nil {
			switch {
			case s.IsLeader:
				line += "  leader"
			case s.LeaderHTTPAddr == "":
				line += "  no leader known"
			}
			if api == "" {
				api = c.HTTP
			}
		}
		fmt.Fprintln(out, line)
	}
	fmt.Fprintf(out, "\nagents:\n")
	names := make([]string, 0, len(ri.Agents))
	for name := range ri.Agents {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		alive := procAlive(ri.Agents[name], "gpuaas-lab-agent")
		if !alive {
			down = append(down, name)
		}
		fmt.Fprintf(out, "  %-14s pid %-7d %s\n", name, ri.Agents[name], aliveWord(alive))
	}
	if len(names) == 0 {
		fmt.Fprintf(out, "  none started yet\n")
	}
	if api != "" {
		var nodes proto.List[proto.Node]
		if err := getJSON(ctx, launch.APIURL(api)+"/v1/nodes", token, &nodes); err != nil {
			fmt.Fprintf(out, "\nnodes: %v\n", err)
		} else {
			fmt.Fprintf(out, "\nnodes:\n")
			for _, n := range nodes.Items {
				fmt.Fprintf(out, "  %-7s %-9s %-11s slice-ready %s\n", n.ID, n.ProfileIntent, n.State, cli.SliceReady(n))
			}
		}
	}
	if len(down) > 0 {
		return fmt.Errorf("down: %s (logs in %s)", strings.Join(down, ", "), filepath.Join(dir, "logs"))
	}
	return nil
}

func aliveWord(alive bool) string {
	if alive {
		return "alive"
	}
	return "DOWN"
}

// probeReady is a coordinator's /readyz answer in a few words.
func probeReady(ctx context.Context, addr string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, launch.APIURL(addr)+"/readyz", nil)
	if err != nil {
		return "readyz: " + err.Error()
	}
	resp, err := labHTTP.Do(req)
	if err != nil {
		return "not answering"
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Reason string `json:"reason"`
	}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&r)
	if resp.StatusCode == http.StatusOK {
		return "ready"
	}
	if r.Reason != "" {
		return "not ready: " + r.Reason
	}
	return "not ready: " + resp.Status
}

// runStop stops the lab of a folder started in another shell: SIGTERM to
// its gpuaas-lab process (which stops the agents, the coordinators and the
// real slice host as Ctrl-C does), then wait until it is gone. When
// gpuaas-lab died without stopping its children, they are stopped instead.
func runStop(args []string, out io.Writer) error {
	var timeout time.Duration
	dir, err := labDirFlag("stop", args, func(fs *flag.FlagSet) {
		fs.DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the lab to stop")
	})
	if err != nil {
		return err
	}
	ri, err := readRunInfo(dir)
	if errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(out, "no lab is running in %s\n", dir)
		return nil
	}
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	if labAlive(ri) {
		fmt.Fprintf(out, "stopping the lab in %s (gpuaas-lab pid %d)...\n", dir, ri.PID)
		if err := syscall.Kill(ri.PID, syscall.SIGTERM); err != nil {
			return fmt.Errorf("signal gpuaas-lab pid %d: %w", ri.PID, err)
		}
		if !waitGone(deadline, func() bool { return labAlive(ri) }) {
			return fmt.Errorf("gpuaas-lab pid %d still runs after %s (its log is on the terminal that started it); kill -9 %d stops it without clean-up", ri.PID, timeout, ri.PID)
		}
		fmt.Fprintf(out, "stopped\n")
		return nil
	}
	// gpuaas-lab is gone (killed): stop what it left running.
	type child struct {
		name, bin string
		pid       int
	}
	var left []child
	for id, pid := range ri.Coordinators {
		if procAlive(pid, "gpuaas-coordinator") {
			left = append(left, child{id, "gpuaas-coordinator", pid})
		}
	}
	for name, pid := range ri.Agents {
		if procAlive(pid, "gpuaas-lab-agent") {
			left = append(left, child{name, "gpuaas-lab-agent", pid})
		}
	}
	if len(left) == 0 {
		fmt.Fprintf(out, "no lab is running in %s (gpuaas-lab pid %d is gone; removing its stale %s)\n", dir, ri.PID, runFileName)
		return os.Remove(filepath.Join(dir, runFileName))
	}
	// Agents first, as the lab stops them.
	slices.SortFunc(left, func(a, b child) int { return strings.Compare(b.bin, a.bin) })
	for _, c := range left {
		fmt.Fprintf(out, "gpuaas-lab pid %d is gone; stopping its %s (pid %d)\n", ri.PID, c.name, c.pid)
		_ = syscall.Kill(c.pid, syscall.SIGTERM)
		if !waitGone(deadline, func() bool { return procAlive(c.pid, c.bin) }) {
			return fmt.Errorf("%s (pid %d) still runs after %s", c.name, c.pid, timeout)
		}
	}
	fmt.Fprintf(out, "stopped (a real slice host's VMs, bridge and loop devices are not cleaned up without gpuaas-lab: start and stop the lab again)\n")
	return os.Remove(filepath.Join(dir, runFileName))
}

// waitGone polls alive until it is false or the deadline passes.
func waitGone(deadline time.Time, alive func() bool) bool {
	for alive() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}
