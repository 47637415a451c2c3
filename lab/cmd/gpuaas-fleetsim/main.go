// Command gpuaas-fleetsim runs a simulated fleet (lab/fleetsim) against a
// running coordinator cluster: N lightweight agents in this one process
// enroll for nodes that already exist in the ledger (e.g. loaded from a
// synthetic inventory), then heartbeat, report readiness and long-poll at
// the agent's production intervals, optionally with a placement stream
// on top. It prints the fleet's counters and the placement latencies
// when -duration runs out (or on Ctrl-C).
//
//	gpuaas-fleetsim -coordinators https://127.0.0.1:8443,https://127.0.0.1:8444 \
//	    -ca-file .lab/ca.pem -token-file admin.token -agents 1000 -node-format sim-n%04d \
//	    -region sim -place-rate 20 -duration 5m
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/lab/fleetsim"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "gpuaas-fleetsim:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("gpuaas-fleetsim", flag.ContinueOnError)
	coords := fs.String("coordinators", "", "coordinator API URLs, comma-separated (https://host:port)")
	caFile := fs.String("ca-file", "", "cluster CA certificate (PEM)")
	tokenFile := fs.String("token-file", "", "file with an admin API token (mints the bootstrap tokens, places)")
	agents := fs.Int("agents", 100, "number of simulated agents")
	nodeFormat := fs.String("node-format", "sim-n%04d", "node ID of agent i (fmt verb for i); the nodes must exist")
	region := fs.String("region", "", "region of the placement stream (\"\": no placements)")
	placeRate := fs.Float64("place-rate", 10, "placements per second of the stream")
	gossipJoin := fs.String("gossip-join", "", "coordinator gossip addresses, comma-separated (with -gossip-agents)")
	gossipAgents := fs.Int("gossip-agents", 0, "how many agents also join the gossip pool")
	duration := fs.Duration("duration", time.Minute, "how long the fleet runs after enrolling")
	heartbeat := fs.Duration("heartbeat-interval", 0, "heartbeat interval (0: the agent's default, 10s)")
	readiness := fs.Duration("readiness-interval", 0, "readiness interval (0: the agent's default, 30s)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *coords == "" || *tokenFile == "" {
		return errors.New("-coordinators and -token-file are required")
	}
	if *agents <= 0 {
		return fmt.Errorf("-agents %d: must be positive", *agents)
	}
	if strings.Count(*nodeFormat, "%") != 1 {
		return fmt.Errorf("-node-format %q: needs exactly one fmt verb for the agent number", *nodeFormat)
	}
	tok, err := os.ReadFile(*tokenFile)
	if err != nil {
		return fmt.Errorf("read -token-file: %w", err)
	}
	urls := strings.Split(*coords, ",")
	var apis []*cli.Client
	for _, u := range urls {
		c, err := cli.NewClient(u, strings.TrimSpace(string(tok)), *caFile)
		if err != nil {
			return err
		}
		apis = append(apis, c)
	}
	cfg := fleetsim.Config{Coordinators: urls, Mint: fleetsim.APIMinter(apis, time.Hour), GossipMembers: *gossipAgents,
		HeartbeatInterval: *heartbeat, ReadinessInterval: *readiness, Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if *gossipJoin != "" {
		cfg.GossipJoin = strings.Split(*gossipJoin, ",")
	}
	if *caFile != "" {
		if cfg.CA, err = pki.LoadPool(*caFile); err != nil {
			return err
		}
	}
	for i := range *agents {
		cfg.Nodes = append(cfg.Nodes, fmt.Sprintf(*nodeFormat, i))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	t0 := time.Now()
	f, err := fleetsim.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer f.Stop()
	fmt.Printf("%d agents enrolled in %v\n", *agents, time.Since(t0).Round(time.Millisecond))
	rctx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	var ps fleetsim.PlaceStats
	if *region != "" {
		if ps, err = fleetsim.Place(rctx, fleetsim.PlaceConfig{APIs: apis, Region: *region, Rate: *placeRate}); err != nil {
			return err
		}
	} else {
		<-rctx.Done()
	}
	st := f.Stats()
	fmt.Printf("agents %d: heartbeats %d, readiness %d, polls %d, tasks %d, errors %d (last: %s)\n",
		st.Agents, st.Heartbeats, st.Readiness, st.Polls, st.TasksDone, st.Errors, f.LastError())
	if *region != "" {
		fmt.Printf("placements: %d placed, %d refused, %d failed, %d released; p50 %.1f ms, p99 %.1f ms (last error: %s)\n",
			ps.Placed, ps.Refused, ps.Failed, ps.Released, ps.Quantile(0.5), ps.Quantile(0.99), ps.LastError)
	}
	return nil
}
