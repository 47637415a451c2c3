// Command etcdref measures the claim ledger a Kubernetes-style GPU
// scheduler would use instead of gpuaas's: a 3-member etcd v3.6 cluster
// (embed, fsync on) in one process on loopback, committing slot claims
//
//	Txn(If(Version(slot) == 0)).Then(Put(slot, alloc), Put(alloc, slot))
//
// over the same inventory and client count as the coordinator's placement
// benchmark (1,000 nodes × 8 slots, 64 claiming clients, a pool of 64
// releasers deleting every claim beyond one held per client so capacity
// never runs out). Only committed claims count. It is the side-by-side
// reference of `make bench` (placements_vs_etcd_claims_ratio): a separate
// module so the product's go.mod does not carry etcd's dependency tree.
//
// It writes one bench part file (-out), in the report's metric format.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// metric is test/bench's Metric (the report's format), copied so this
// module does not depend on the product's.
type metric struct {
	Metric     string    `json:"metric"`
	Value      float64   `json:"value"`
	Unit       string    `json:"unit"`
	Target     string    `json:"target"`
	Met        bool      `json:"met"`
	MeasuredAt time.Time `json:"measured_at"`
	Notes      string    `json:"notes"`
}

func main() {
	out := flag.String("out", "", "bench part file to write (required)")
	dur := flag.Duration("duration", 8*time.Second, "measured time")
	clients := flag.Int("clients", 64, "claiming clients")
	nodes := flag.Int("nodes", 1000, "nodes (8 slots each)")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "etcdref: -out is required")
		os.Exit(2)
	}
	if err := run(*out, *dur, *clients, *nodes); err != nil {
		fmt.Fprintln(os.Stderr, "etcdref:", err)
		os.Exit(1)
	}
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

func mustURL(s string) url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return *u
}

// startCluster starts three embedded members with default (fsync on)
// durability and returns them and their client URLs.
func startCluster(dir string) ([]*embed.Etcd, []string, error) {
	ports, err := freePorts(6)
	if err != nil {
		return nil, nil, err
	}
	initial := ""
	for i := range 3 {
		if i > 0 {
			initial += ","
		}
		initial += fmt.Sprintf("m%d=http://127.0.0.1:%d", i, ports[2*i+1])
	}
	var members []*embed.Etcd
	var endpoints []string
	for i := range 3 {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = filepath.Join(dir, cfg.Name)
		cu := mustURL(fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]))
		pu := mustURL(fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]))
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
		cfg.InitialCluster = initial
		cfg.InitialClusterToken = "etcdref"
		cfg.ClusterState = embed.ClusterStateFlagNew
		cfg.Logger, cfg.LogLevel = "zap", "error"
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		endpoints = append(endpoints, cu.String())
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			for _, m := range members {
				m.Close()
			}
			return nil, nil, fmt.Errorf("start member %s: %w", cfg.Name, err)
		}
		members = append(members, e)
	}
	for _, m := range members {
		select {
		case <-m.Server.ReadyNotify():
		case <-time.After(60 * time.Second):
			for _, m := range members {
				m.Close()
			}
			return nil, nil, fmt.Errorf("cluster not ready after 60s")
		}
	}
	return members, endpoints, nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func run(out string, dur time.Duration, clients, nodes int) error {
	dir, err := os.MkdirTemp("", "etcdref-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	members, endpoints, err := startCluster(dir)
	if err != nil {
		return err
	}
	defer func() {
		for _, m := range members {
			m.Close()
		}
	}()
	// One client connection per member, clients spread over them (as
	// placing clients spread over coordinators).
	var conns []*clientv3.Client
	for _, ep := range endpoints {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return fmt.Errorf("client %s: %w", ep, err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	slots := nodes * 8
	slotKey := func(i int) string { return fmt.Sprintf("/slots/n%05d/s%d", i/8, i%8) }

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	release := make(chan [2]string, 4096)
	var claims, conflicts, errs atomic.Int64
	var measuring atomic.Bool
	var wg sync.WaitGroup
	for r := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kv := conns[r%len(conns)]
			for {
				select {
				case <-ctx.Done():
					return
				case k := <-release:
					if _, err := kv.Txn(ctx).Then(clientv3.OpDelete(k[0]), clientv3.OpDelete(k[1])).Commit(); err != nil && ctx.Err() == nil {
						errs.Add(1)
					}
				}
			}
		}()
	}
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kv := conns[c%len(conns)]
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			var held [2]string
			for n := 0; ctx.Err() == nil; n++ {
				slot := slotKey(rng.IntN(slots))
				alloc := fmt.Sprintf("/allocs/c%d-%d", c, n)
				resp, err := kv.Txn(ctx).If(clientv3.Compare(clientv3.Version(slot), "=", 0)).
					Then(clientv3.OpPut(slot, alloc), clientv3.OpPut(alloc, slot)).Commit()
				switch {
				case err != nil:
					if ctx.Err() == nil {
						errs.Add(1)
					}
					continue
				case !resp.Succeeded:
					conflicts.Add(1)
					continue
				}
				if measuring.Load() {
					claims.Add(1)
				}
				if held[0] != "" {
					select {
					case release <- held:
					case <-ctx.Done():
						return
					}
				}
				held = [2]string{slot, alloc}
			}
		}()
	}
	time.Sleep(2 * time.Second) // warm-up
	cpu0, t0 := cpuTime(), time.Now()
	measuring.Store(true)
	time.Sleep(dur)
	measuring.Store(false)
	elapsed, cpu := time.Since(t0), cpuTime()-cpu0
	n := claims.Load()
	cancel()
	wg.Wait()
	if n == 0 {
		return fmt.Errorf("no claim committed in %s (%d errors)", dur, errs.Load())
	}
	rate := float64(n) / elapsed.Seconds()
	notes := fmt.Sprintf("etcd server/client v3.6.16 embed, 3 members in one process on loopback TCP, fsync on (defaults), %d clients over 3 client connections (one per member), %d nodes x 8 slots; claim = Txn(If(Version(slot)==0)).Then(Put(slot, alloc), Put(alloc, slot)), every claim beyond one held per client deleted by a pool of %d releasers; %s measured after 2 s warm-up; %d committed claims, %d lost races, %d errors; %.0f µs of process CPU per committed claim (all 3 members + clients); GOMAXPROCS %d",
		clients, nodes, clients, elapsed.Round(time.Millisecond), n, conflicts.Load(), errs.Load(),
		float64(cpu.Microseconds())/float64(n), runtime.GOMAXPROCS(0))
	now := time.Now().UTC()
	ms := []metric{{Metric: "etcd_claims_per_s_3members", Value: rate, Unit: "claims/s", Target: "none", Met: true, MeasuredAt: now, Notes: notes}}
	b, err := json.MarshalIndent(ms, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("etcd_claims_per_s_3members %.0f (%s)\n", rate, notes)
	return nil
}
