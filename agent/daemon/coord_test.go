package daemon

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/membership"
	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/proto"
)

// coord is a real one-replica coordinator (Raft on loopback, bbolt log)
// serving the operator and agent APIs, with the lab nodes registered.
type coord struct {
	t     testing.TB
	srv   *server.Server
	url   string // https://; agents trust caFile
	admin string
	op    string
	// ca is the cluster CA the coordinator serves TLS from; caFile its
	// certificate, hc a client trusting it.
	ca     *pki.CA
	caFile string
	hc     *http.Client
	// agents are clients presenting a node's certificate, by the node
	// credential do sends (the test's own agents: enroll).
	mu     sync.Mutex
	agents map[string]*http.Client
	// polls counts the agents' task long-polls (GET /v1/agent/tasks)
	// in flight on this coordinator.
	polls pollGauge
}

// pollGauge counts the task long-polls in flight, and the most at once.
type pollGauge struct {
	mu       sync.Mutex
	open     int
	peak     int
	answered int
}

func (g *pollGauge) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != proto.AgentTasksPath {
			h.ServeHTTP(w, r)
			return
		}
		g.mu.Lock()
		g.open++
		g.peak = max(g.peak, g.open)
		g.mu.Unlock()
		defer func() {
			g.mu.Lock()
			g.open--
			g.answered++
			g.mu.Unlock()
		}()
		h.ServeHTTP(w, r)
	})
}

// read returns the polls open now, the most open at once and the polls
// answered.
func (g *pollGauge) read() (open, peak, answered int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open, g.peak, g.answered
}

// nodeCert makes do present cert with credential cred (mutual TLS on the
// agent routes).
func (c *coord) nodeCert(cred string, cert *tls.Certificate) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.agents == nil {
		c.agents = map[string]*http.Client{}
	}
	c.agents[cred] = &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientConfig(c.ca.Pool(), cert)}}
}

// backend adapts *server.Server to api.Backend (as the coordinator binary
// does) while keeping Enrollment.
type backend struct{ *server.Server }

func (b backend) Peers() ([]api.Peer, error) {
	ps, err := b.Server.Peers()
	if err != nil {
		return nil, err
	}
	out := make([]api.Peer, len(ps))
	for i, p := range ps {
		out[i] = api.Peer(p)
	}
	return out, nil
}

func startCoord(t testing.TB, nodes ...string) *coord {
	t.Helper()
	admin, err := api.GenerateToken()
	require.NoError(t, err)
	op, err := api.GenerateToken()
	require.NoError(t, err)
	auth, err := api.NewTokens([]api.TokenEntry{{Name: "admin", Role: "admin", SHA256: api.HashToken(admin)}, {Name: "op", Role: "operator", SHA256: api.HashToken(op)}})
	require.NoError(t, err)
	inv := &server.Inventory{
		Regions: []proto.Region{{Name: "us-east"}},
		Pools:   []proto.Pool{{Name: "h200", Region: "us-east"}},
	}
	for _, n := range nodes {
		inv.Nodes = append(inv.Nodes, server.InventoryNode{Node: proto.Node{ID: n, Hostname: n, Region: "us-east", Pool: "h200",
			ProfileIntent: proto.IntentSliceVM, State: proto.NodeRegistered}})
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ca, err := pki.NewCA("daemon test CA", time.Now(), 24*time.Hour)
	require.NoError(t, err)
	cert, err := ca.IssueServer("c1", []string{"127.0.0.1"}, time.Now(), time.Hour)
	require.NoError(t, err)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, ca.CertPEM, 0o644))
	srv, err := server.New(server.Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: ln.Addr().String(),
		BootstrapExpect: 1, Inventory: inv, Logger: quiet, TLS: &server.TLSConfig{CA: ca, Cert: cert}})
	if err != nil {
		ln.Close()
		require.NoError(t, err)
	}
	c := &coord{t: t, srv: srv, url: "https://" + ln.Addr().String(), admin: admin, op: op, ca: ca, caFile: caFile,
		hc: &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientConfig(ca.Pool(), nil)}}}
	mux := http.NewServeMux()
	mux.Handle("/v1/internal/", srv.InternalHandler())
	mux.Handle("/", api.New(backend{srv}, auth, quiet))
	hs := &http.Server{Handler: c.polls.wrap(mux), ReadHeaderTimeout: 5 * time.Second, TLSConfig: pki.APIServerConfigFrom(srv.TLS()),
		ErrorLog: log.New(io.Discard, "", 0)}
	go hs.ServeTLS(ln, "", "")
	t.Cleanup(func() {
		hs.Close()
		srv.Shutdown()
	})
	require.Eventually(t, func() bool {
		if !srv.IsLeader() {
			return false
		}
		for _, n := range nodes {
			if _, ok := srv.Store().Snapshot().Node(n); !ok {
				return false
			}
		}
		return true
	}, 15*time.Second, 20*time.Millisecond, "leader elected and inventory loaded")
	return c
}

// do sends a JSON request with a bearer token and decodes the answer.
func (c *coord) do(method, path, token string, in, out any) (int, string) {
	c.t.Helper()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		require.NoError(c.t, err)
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, c.url+path, body)
	require.NoError(c.t, err)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if method == http.MethodPost && path == "/v1/allocations" {
		req.Header.Set("Idempotency-Key", "k-"+time.Now().Format("150405.000000000"))
	}
	hc := c.hc
	c.mu.Lock()
	if a, ok := c.agents[token]; ok {
		hc = a
	}
	c.mu.Unlock()
	resp, err := hc.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	if out != nil && resp.StatusCode < 300 {
		require.NoError(c.t, json.Unmarshal(b, out), string(b))
	}
	return resp.StatusCode, string(b)
}

// mint mints a bootstrap token for node.
func (c *coord) mint(node string, ttl int) string {
	c.t.Helper()
	var r proto.BootstrapTokenResponse
	code, body := c.do(http.MethodPost, "/v1/nodes/"+node+"/bootstrap-tokens", c.admin, proto.BootstrapTokenCreateRequest{TTLSeconds: ttl}, &r)
	require.Equal(c.t, http.StatusCreated, code, body)
	return r.Token
}

func (c *coord) node(id string) proto.Node {
	c.t.Helper()
	n, ok := c.srv.Store().Snapshot().Node(id)
	require.True(c.t, ok)
	return *n
}

// approveSlots discovers the topology of node, a simulated H200 host
// (eight candidates), and approves every candidate as a slot.
func (c *coord) approveSlots(node string) {
	c.t.Helper()
	code, body := c.do(http.MethodPost, "/v1/nodes/"+node+"/topology/discover", c.admin, nil, nil)
	require.Equal(c.t, http.StatusAccepted, code, body)
	require.Eventually(c.t, func() bool {
		tp, ok := c.srv.Store().Snapshot().Candidates(node)
		return ok && len(tp.Candidates) == 8
	}, 15*time.Second, 20*time.Millisecond)
	for i := range 8 {
		code, body := c.do(http.MethodPost, "/v1/nodes/"+node+"/slots", c.admin, proto.SlotApproveBody{Index: i}, nil)
		require.Equal(c.t, http.StatusCreated, code, body)
	}
}

// slot is slot i of node as the ledger holds it.
func (c *coord) slot(node string, i int) *proto.Slot {
	c.t.Helper()
	s, ok := c.srv.Store().Snapshot().Slot(proto.SlotID(node, i))
	require.True(c.t, ok)
	return s
}

// hardwareState is the state of slot i of node's last hardware scan in
// the ledger ("" before the first).
func (c *coord) hardwareState(node string, i int) string {
	c.t.Helper()
	if h := c.slot(node, i).Hardware; h != nil {
		return h.State
	}
	return ""
}

// runSlice places a one-GPU slice in us-east and waits until it is
// active; busy is the index of the slot of node it runs on.
func (c *coord) runSlice(node string) (alloc proto.Allocation, busy int) {
	c.t.Helper()
	code, body := c.do(http.MethodPost, "/v1/allocations", c.op, proto.AllocationCreateRequest{
		CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 1, Region: "us-east"}, &alloc)
	require.Less(c.t, code, 300, body)
	require.Eventually(c.t, func() bool {
		al, ok := c.srv.Store().Snapshot().Allocation(alloc.ID)
		return ok && al.State == proto.AllocActive
	}, 20*time.Second, 50*time.Millisecond)
	busy = -1
	for i := range 8 {
		if c.slot(node, i).ClaimID != "" {
			busy = i
		}
	}
	require.GreaterOrEqual(c.t, busy, 0)
	return alloc, busy
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

// gossipPool starts the coordinator's member of the agents' pool as the
// coordinator binary does: encrypted with a fresh cluster key that the
// leader seeds into the replicated keyring (agents get it at enrollment),
// following the keyring, and watched by WatchAgents.
func (c *coord) gossipPool(t testing.TB) *membership.Pool {
	t.Helper()
	key := make([]byte, proto.GossipKeySize)
	_, err := rand.Read(key)
	require.NoError(t, err)
	pool, err := membership.Start(membership.Config{Name: "coordinator-c1", BindAddr: "127.0.0.1", BindPort: 0, Keys: [][]byte{key},
		Meta: membership.Meta{Role: membership.RoleCoordinator, NodeID: "c1"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pool.Shutdown() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { c.srv.WatchAgents(ctx, pool); done <- struct{}{} }()
	go func() {
		c.srv.SyncGossipKeyring(ctx, pool, base64.StdEncoding.EncodeToString(key), nil)
		done <- struct{}{}
	}()
	t.Cleanup(func() { cancel(); <-done; <-done })
	require.Eventually(t, func() bool { return c.srv.GossipKeyring().Version > 0 }, 10*time.Second, 20*time.Millisecond, "keyring seeded")
	return pool
}
