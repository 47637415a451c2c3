// Command gpuaas-lab runs the simulated lab: three coordinator processes on
// loopback forming a Raft cluster, loaded with the lab inventory, with data,
// logs and tokens under one folder (.lab by default). It prints how to reach
// the API and stops everything cleanly on Ctrl-C. Run again, it restarts the
// same cluster on the same ports with its state intact.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gpuaas/gpuaas/lab"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/proto"
)

// state is what a lab folder remembers across runs: ports are part of the
// Raft configuration, so a restarted lab must reuse them.
type state struct {
	Coordinators []coord `json:"coordinators"`
}

type coord struct {
	ID   string `json:"id"`
	HTTP string `json:"http"`
	Raft string `json:"raft"`
}

type tokens struct {
	Admin    string `json:"admin"`
	Operator string `json:"operator"`
	Viewer   string `json:"viewer"`
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gpuaas-lab:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("gpuaas-lab", flag.ContinueOnError)
	dir := fs.String("dir", envOr("GPUAAS_LAB_DIR", ".lab"), "lab folder: data, logs, tokens")
	n := fs.Int("coordinators", 3, "coordinator replicas (1, 3 or 5)")
	inventory := fs.String("inventory", "", "inventory JSON (default: the embedded lab inventory)")
	once := fs.Bool("once", false, "start, wait until the cluster serves, print the summary and stop (for tests)")
	fresh := fs.Bool("fresh", false, "delete the lab folder first")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n != 1 && *n != 3 && *n != 5 {
		return fmt.Errorf("-coordinators %d: use 1, 3 or 5", *n)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	if *fresh {
		if err := os.RemoveAll(abs); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return err
	}
	bin, err := launch.FindBinary("gpuaas-coordinator")
	if err != nil {
		return err
	}
	st, err := loadOrPickState(abs, *n)
	if err != nil {
		return err
	}
	toks, tokensFile, err := loadOrMakeTokens(abs)
	if err != nil {
		return err
	}
	invPath := *inventory
	if invPath == "" {
		invPath = filepath.Join(abs, "inventory.json")
		if err := os.WriteFile(invPath, lab.Inventory, 0o644); err != nil {
			return err
		}
	}

	var procs []*launch.Proc
	var joins []string
	for _, c := range st.Coordinators {
		joins = append(joins, c.HTTP)
	}
	for _, c := range st.Coordinators {
		p := &launch.Proc{
			Name: c.ID,
			Args: []string{bin,
				"-node-id", c.ID,
				"-data-dir", filepath.Join(abs, "data", c.ID),
				"-raft-addr", c.Raft,
				"-http-addr", c.HTTP,
				"-bootstrap-expect", fmt.Sprint(len(st.Coordinators)),
				"-join", strings.Join(joins, ","),
				"-tokens-file", tokensFile,
				"-inventory", invPath,
				"-log-format", "text",
			},
			LogPath: filepath.Join(abs, "logs", c.ID+".log"),
		}
		if err := p.Start(); err != nil {
			launch.StopAll(procs, 10*time.Second, log)
			return err
		}
		log.Info("started coordinator", "id", c.ID, "http", c.HTTP, "pid", p.Pid(), "log", p.LogPath)
		procs = append(procs, p)
	}
	defer launch.StopAll(procs, 15*time.Second, log)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	leader, err := waitCluster(ctx, st, toks.Admin)
	if err != nil {
		return fmt.Errorf("%w (logs in %s)", err, filepath.Join(abs, "logs"))
	}
	if err := writeEnv(abs, st.Coordinators[0].HTTP, toks.Operator); err != nil {
		return err
	}
	printSummary(out, abs, st, leader, toks)
	if *once {
		return nil
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	exited := make(chan string, len(procs))
	for _, p := range procs {
		go func(p *launch.Proc) {
			for p.Running() {
				time.Sleep(500 * time.Millisecond)
			}
			exited <- p.Name
		}(p)
	}
	select {
	case s := <-sig:
		log.Info("stopping the lab", "signal", s.String())
	case name := <-exited:
		log.Warn("a coordinator exited; stopping the lab", "id", name, "log", filepath.Join(abs, "logs", name+".log"))
	}
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func loadOrPickState(dir string, n int) (state, error) {
	path := filepath.Join(dir, "lab.json")
	var st state
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, &st); err != nil {
			return st, fmt.Errorf("%s: %w (delete the lab folder or run with -fresh)", path, err)
		}
		if len(st.Coordinators) != n {
			return st, fmt.Errorf("%s has %d coordinators, asked for %d: run with -fresh", path, len(st.Coordinators), n)
		}
		return st, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return st, err
	}
	for i := 1; i <= n; i++ {
		hp, err := launch.FreePort()
		if err != nil {
			return st, err
		}
		rp, err := launch.FreePort()
		if err != nil {
			return st, err
		}
		st.Coordinators = append(st.Coordinators, coord{ID: fmt.Sprintf("c%d", i),
			HTTP: fmt.Sprintf("127.0.0.1:%d", hp), Raft: fmt.Sprintf("127.0.0.1:%d", rp)})
	}
	b, _ := json.MarshalIndent(st, "", "  ")
	return st, os.WriteFile(path, append(b, '\n'), 0o644)
}

func loadOrMakeTokens(dir string) (tokens, string, error) {
	secrets := filepath.Join(dir, "tokens.secret.json")
	file := filepath.Join(dir, "tokens.json")
	var t tokens
	if b, err := os.ReadFile(secrets); err == nil {
		if err := json.Unmarshal(b, &t); err == nil && t.Admin != "" {
			return t, file, nil
		}
	}
	var entries []launch.Token
	for _, r := range []struct {
		role string
		dst  *string
	}{{"admin", &t.Admin}, {"operator", &t.Operator}, {"viewer", &t.Viewer}} {
		tok, err := launch.NewToken("lab-"+r.role, r.role)
		if err != nil {
			return t, "", err
		}
		*r.dst = tok.Secret
		entries = append(entries, tok)
	}
	if err := launch.WriteTokensFile(file, entries); err != nil {
		return t, "", err
	}
	b, _ := json.MarshalIndent(t, "", "  ")
	return t, file, os.WriteFile(secrets, append(b, '\n'), 0o600)
}

// waitCluster waits until every coordinator answers /v1/status and one of
// them reports a leader that has loaded the inventory (nodes listed).
func waitCluster(ctx context.Context, st state, token string) (string, error) {
	for _, c := range st.Coordinators {
		if err := launch.WaitHTTP(ctx, "http://"+c.HTTP+"/v1/status", token); err != nil {
			return "", err
		}
	}
	for {
		var status proto.Status
		if err := getJSON(ctx, "http://"+st.Coordinators[0].HTTP+"/v1/status", token, &status); err == nil && status.LeaderHTTPAddr != "" {
			var nodes struct {
				Items []json.RawMessage `json:"items"`
			}
			if err := getJSON(ctx, "http://"+st.Coordinators[0].HTTP+"/v1/nodes?consistent=true", token, &nodes); err == nil && len(nodes.Items) > 0 {
				return status.LeaderHTTPAddr, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("cluster did not elect a leader and load the inventory: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func getJSON(ctx context.Context, url, token string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(v)
}

func writeEnv(dir, addr, token string) error {
	env := fmt.Sprintf("export GPUAAS_ADDR=http://%s\nexport GPUAAS_TOKEN=%s\n", addr, token)
	return os.WriteFile(filepath.Join(dir, "env"), []byte(env), 0o600)
}

func printSummary(out io.Writer, dir string, st state, leader string, t tokens) {
	fmt.Fprintf(out, "\ngpuaas lab is up: %d coordinators (Raft leader at %s), inventory j22u15 + j22u11 (slice), j27u15 (baremetal)\n\n", len(st.Coordinators), leader)
	for _, c := range st.Coordinators {
		fmt.Fprintf(out, "  %s  API http://%s  raft %s  log %s\n", c.ID, c.HTTP, c.Raft, filepath.Join(dir, "logs", c.ID+".log"))
	}
	fmt.Fprintf(out, "\nTokens (admin / operator / viewer) are in %s.\n", filepath.Join(dir, "tokens.secret.json"))
	fmt.Fprintf(out, "In another shell:\n\n  source %s\n  bin/gpuaasctl node list\n  bin/gpuaasctl availability\n  bin/gpuaasctl alloc create --gpus 2 --region lab-east\n  bin/gpuaasctl alloc list\n\n", filepath.Join(dir, "env"))
	fmt.Fprintf(out, "Ctrl-C stops the lab; `make lab` again restarts it with its state.\n")
}
