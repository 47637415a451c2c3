package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// ledgerBackend is an in-process Backend over the real FSM and store:
// commands are encoded exactly as Raft would carry them and applied
// straight into the FSM at increasing indexes (a one-replica ledger
// without the Raft transport). It is a real ledger, not a mock.
type ledgerBackend struct {
	mu         sync.Mutex
	fsm        *fsm.FSM
	index      uint64
	leader     bool
	leaderAddr string
	peers      []Peer
	barriers   int
	clock      time.Time
}

func newLedgerBackend() *ledgerBackend {
	return &ledgerBackend{
		fsm:    fsm.New(state.New(), nil),
		leader: true,
		peers:  []Peer{{ID: "c1", RaftAddr: "127.0.0.1:7500", HTTPAddr: "127.0.0.1:7480", Voter: true, Leader: true}},
		clock:  time.Date(2026, 11, 21, 19, 0, 0, 0, time.UTC),
	}
}

func (b *ledgerBackend) notLeader() error {
	return proto.Errorf(proto.CodeNotLeader, "not the leader; the leader is at %s", b.leaderAddr)
}

func (b *ledgerBackend) Store() *state.Store { return b.fsm.Store() }

func (b *ledgerBackend) Apply(_ context.Context, t proto.MessageType, req any) (any, uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.leader {
		return nil, 0, b.notLeader()
	}
	return b.applyLocked(t, req)
}

func (b *ledgerBackend) applyLocked(t proto.MessageType, req any) (any, uint64, error) {
	buf, err := proto.Encode(t, req)
	if err != nil {
		return nil, 0, err
	}
	b.index++
	resp := b.fsm.ApplyCommand(b.index, buf)
	if e, ok := resp.(error); ok {
		return nil, b.index, e
	}
	return resp, b.index, nil
}

func (b *ledgerBackend) IsLeader() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.leader
}

func (b *ledgerBackend) LeaderHTTPAddr() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.leaderAddr
}

func (b *ledgerBackend) setFollower(leaderAddr string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.leader, b.leaderAddr = false, leaderAddr
}

func (b *ledgerBackend) Barrier(context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.leader {
		return b.notLeader()
	}
	b.barriers++
	return nil
}

func (b *ledgerBackend) Peers() ([]Peer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Peer(nil), b.peers...), nil
}

func (b *ledgerBackend) AddVoter(_ context.Context, id, raftAddr, httpAddr string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.leader {
		return b.notLeader()
	}
	for _, p := range b.peers {
		if p.ID == id {
			return proto.Errorf(proto.CodeAlreadyExists, "server %s is already a peer", id)
		}
	}
	b.peers = append(b.peers, Peer{ID: id, RaftAddr: raftAddr, HTTPAddr: httpAddr, Voter: true})
	return nil
}

func (b *ledgerBackend) RemoveServer(_ context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.leader {
		return b.notLeader()
	}
	for i, p := range b.peers {
		if p.ID == id {
			b.peers = append(b.peers[:i], b.peers[i+1:]...)
			return nil
		}
	}
	return proto.Errorf(proto.CodeNotFound, "server %s is not in the raft configuration", id)
}

func (b *ledgerBackend) TransferLeadership(_ context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.leader {
		return b.notLeader()
	}
	found := false
	for i := range b.peers {
		b.peers[i].Leader = b.peers[i].ID == id
		found = found || b.peers[i].ID == id
	}
	if !found {
		return proto.Errorf(proto.CodeNotFound, "server %s is not a voter", id)
	}
	return nil
}

// env is one API server over a ledger, with a token per role and the
// OpenAPI document every response is checked against.
type env struct {
	t    testing.TB
	b    Backend
	lb   *ledgerBackend // nil when b is a real server
	api  *API
	srv  *httptest.Server
	url  string
	tok  map[Role]string
	doc  *openapi3.T
	logs *syncBuffer
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

var (
	docOnce sync.Once
	docVal  *openapi3.T
	docErr  error
)

// loadDoc loads and validates proto/openapi.yaml once per test binary.
func loadDoc(t testing.TB) *openapi3.T {
	t.Helper()
	docOnce.Do(func() {
		l := openapi3.NewLoader()
		docVal, docErr = l.LoadFromData(proto.OpenAPI())
		if docErr == nil {
			docErr = docVal.Validate(context.Background())
		}
	})
	require.NoError(t, docErr, "proto/openapi.yaml")
	return docVal
}

// otherTenant is the env's key (e.tok, e.do) of a second tenant token,
// named other-tenant; RoleTenant's is named tenant-user.
const otherTenant Role = 100

// testTokens returns an Authenticator with one token per role and the
// tokens by role.
func testTokens(t testing.TB) (*Tokens, map[Role]string) {
	t.Helper()
	tok := map[Role]string{}
	var entries []TokenEntry
	for _, r := range []Role{RoleTenant, RoleViewer, RoleOperator, RoleAdmin} {
		s, err := GenerateToken()
		require.NoError(t, err)
		tok[r] = s
		entries = append(entries, TokenEntry{Name: r.String() + "-user", Role: r.String(), SHA256: HashToken(s)})
	}
	// A second tenant, to prove tenants do not see each other.
	s, err := GenerateToken()
	require.NoError(t, err)
	tok[otherTenant] = s
	entries = append(entries, TokenEntry{Name: "other-tenant", Role: "tenant", SHA256: HashToken(s)})
	a, err := NewTokens(entries)
	require.NoError(t, err)
	return a, tok
}

func newEnv(t testing.TB) *env {
	t.Helper()
	lb := newLedgerBackend()
	e := newEnvWith(t, lb)
	e.lb = lb
	return e
}

func newEnvWith(t testing.TB, b Backend) *env {
	t.Helper()
	auth, tok := testTokens(t)
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a := New(b, auth, log)
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	return &env{t: t, b: b, api: a, srv: srv, url: srv.URL, tok: tok, doc: loadDoc(t), logs: logs}
}

// resp is one answer of the API.
type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) decode(t testing.TB, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal(r.body, v), "body: %s", r.body)
}

func (r resp) problem(t testing.TB) proto.Problem {
	t.Helper()
	require.Equal(t, proto.ProblemContentType, r.header.Get("Content-Type"), "body: %s", r.body)
	var p proto.Problem
	r.decode(t, &p)
	require.Equal(t, r.status, p.Status)
	return p
}

// requireProblem asserts a problem answer with status and code.
func (r resp) requireProblem(t testing.TB, status int, code proto.Code) proto.Problem {
	t.Helper()
	require.Equal(t, status, r.status, "body: %s", r.body)
	p := r.problem(t)
	require.Equal(t, code, p.Code, "detail: %s", p.Detail)
	require.NotEmpty(t, p.Detail)
	require.NotEmpty(t, p.RequestID)
	return p
}

// do sends one request as role (0: no token) and validates the answer
// (and, when it succeeded, the request) against the OpenAPI document.
// body may be nil, a string (sent raw) or a value (sent as JSON).
// hdr holds extra header name/value pairs.
func (e *env) do(role Role, method, path string, body any, hdr ...string) resp {
	e.t.Helper()
	var raw []byte
	switch b := body.(type) {
	case nil:
	case string:
		raw = []byte(b)
	case []byte:
		raw = b
	default:
		var err error
		raw, err = json.Marshal(b)
		require.NoError(e.t, err)
	}
	req, err := http.NewRequest(method, e.url+path, bytes.NewReader(raw))
	require.NoError(e.t, err)
	if len(raw) > 0 {
		req.Header.Set("Content-Type", "application/json")
	}
	if role != 0 {
		req.Header.Set("Authorization", "Bearer "+e.tok[role])
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	require.NoError(e.t, err)
	r := resp{status: res.StatusCode, header: res.Header, body: out}
	e.validate(req, raw, r)
	return r
}

// validate checks r against the operation of the route that served req.
func (e *env) validate(req *http.Request, reqBody []byte, r resp) {
	e.t.Helper()
	probe := req.Clone(context.Background())
	probe.URL.Host, probe.URL.Scheme = "", ""
	_, pattern := e.api.mux.Handler(probe)
	method, path, ok := strings.Cut(pattern, " ")
	if !ok || r.status == http.StatusMethodNotAllowed {
		// The 404 catch-all or a 405: not a documented route, but
		// still a problem body.
		r.problem(e.t)
		return
	}
	item := e.doc.Paths.Find(path)
	require.NotNil(e.t, item, "route %s is served but not documented", pattern)
	op := item.GetOperation(method)
	require.NotNil(e.t, op, "route %s is served but not documented", pattern)
	params := map[string]string{}
	pp := strings.Split(path, "/")
	rp := strings.Split(req.URL.Path, "/")
	for i, seg := range pp {
		if strings.HasPrefix(seg, "{") && i < len(rp) {
			params[strings.Trim(seg, "{}")] = rp[i]
		}
	}
	opts := &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true, MultiError: true}
	in := &openapi3filter.RequestValidationInput{
		Request:    req.Clone(context.Background()),
		PathParams: params,
		Route:      &routers.Route{Spec: e.doc, Path: path, PathItem: item, Method: method, Operation: op},
		Options:    opts,
	}
	in.Request.Body = io.NopCloser(bytes.NewReader(reqBody))
	if r.status < 300 {
		require.NoError(e.t, openapi3filter.ValidateRequest(context.Background(), in),
			"%s %s was accepted but does not match the documented request", method, req.URL)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: r.status, Header: r.header, Options: opts}
	out.SetBodyBytes(r.body)
	require.NoError(e.t, openapi3filter.ValidateResponse(context.Background(), out),
		"%s %s answered %d with a body that does not match the document: %s", method, req.URL, r.status, r.body)
}

// apply proposes a command straight into the backend (fixtures).
func (e *env) apply(t proto.MessageType, req any) any {
	e.t.Helper()
	resp, _, err := e.b.Apply(context.Background(), t, req)
	require.NoError(e.t, err, "apply %s", t)
	return resp
}

var fixtureAt = time.Date(2026, 11, 21, 19, 0, 0, 0, time.UTC)

// capacity is a complete runtime binding for slot i of node.
func capacity(node string, i int) proto.SlotCapacity {
	sw := "sw0"
	if i >= 4 {
		sw = "sw1"
	}
	return proto.SlotCapacity{
		GPUPCIAddress:      fmt.Sprintf("0000:%02x:00.0", 0x18+i*0x10),
		NUMANode:           i / 4,
		PCIeSwitch:         sw,
		NVMe:               proto.DiskIdentity{Serial: fmt.Sprintf("S6EX%s%02d", strings.ToUpper(node), i), Model: "SAMSUNG MZWLR3T8HCLS"},
		ManagementMAC:      fmt.Sprintf("52:54:00:%02x:00:%02x", len(node), i),
		PrivateIP:          fmt.Sprintf("10.77.%d.%d", len(node), 10+i),
		FabricClaimMode:    proto.FabricPerSlotVF,
		FabricVFPCIAddress: fmt.Sprintf("0000:%02x:00.2", 0x1a+i*0x10),
	}
}

// seedRegion creates a region and a pool.
func (e *env) seedRegion(region, pool string) {
	e.t.Helper()
	e.apply(proto.RegionUpsertType, proto.RegionUpsertRequest{At: fixtureAt, Region: proto.Region{Name: region}})
	e.apply(proto.PoolUpsertType, proto.PoolUpsertRequest{At: fixtureAt, Pool: proto.Pool{Name: pool, Region: region}})
}

// seedNode registers an active node with intent, reports it slice-ready
// and a candidate topology of n GPUs, and approves slots approved of them.
func (e *env) seedNode(id, region, pool string, intent proto.ProfileIntent, n, approved int) {
	e.t.Helper()
	e.apply(proto.NodeUpsertType, proto.NodeUpsertRequest{At: fixtureAt, Node: proto.Node{
		ID: id, Hostname: id + ".lab", Region: region, Pool: pool, ProfileIntent: intent, State: proto.NodeActive}})
	e.apply(proto.NodeReadinessType, proto.NodeReadinessRequest{At: fixtureAt, NodeID: id, Readiness: proto.Readiness{
		Active: true, SliceReady: intent == proto.IntentSliceVM, ObservedAt: fixtureAt,
		Evidence: []proto.Evidence{{Check: "ovsbr0_gateway", OK: true}, {Check: "dnsmasq_active", OK: true}}}})
	topo := proto.CandidateTopology{NodeID: id, DiscoveredAt: fixtureAt}
	for i := range n {
		topo.Candidates = append(topo.Candidates, proto.SlotCandidate{Index: i, Capacity: capacity(id, i)})
	}
	e.apply(proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: fixtureAt, Topology: topo})
	for i := range approved {
		e.apply(proto.SlotApproveType, proto.SlotApproveRequest{At: fixtureAt, NodeID: id, Index: i, Capacity: capacity(id, i)})
	}
}

// seedLab is the lab inventory: two slice hosts of 8 GPUs and a
// baremetal host, in region us-east.
func (e *env) seedLab() {
	e.t.Helper()
	e.seedRegion("us-east", "h200-a")
	e.seedNode("j22u15", "us-east", "h200-a", proto.IntentSliceVM, 8, 8)
	e.seedNode("j22u11", "us-east", "h200-a", proto.IntentSliceVM, 8, 8)
	e.seedNode("j27u15", "us-east", "h200-a", proto.IntentBaremetal, 8, 8)
}

// index is the ledger's index, the audit log aside: a refused request
// changes nothing but leaves its audit record.
func (e *env) index() uint64 {
	s := e.b.Store().Snapshot()
	var m uint64
	for _, t := range state.Tables {
		if t != state.TableAudit {
			m = max(m, s.TableIndex(t))
		}
	}
	return m
}

// Place plans with the scheduler (package sched) on the current snapshot and applies the
// placement command, as the server's planner does (one request per
// batch).
func (b *ledgerBackend) Place(_ context.Context, req proto.AllocationCreateRequest, key string) (proto.Allocation, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.leader {
		return proto.Allocation{}, false, b.notLeader()
	}
	sku, ok := proto.FindSKU(proto.DefaultSKUs(), req.SKU)
	if !ok {
		return proto.Allocation{}, false, proto.Errorf(proto.CodeInvalidArgument, "sku %q is unknown", req.SKU)
	}
	snap := b.fsm.Store().Snapshot()
	var nodeID string
	var nodeIdx uint64
	var slots []proto.SlotExpect
	if sku.Shape == proto.ShapeGPUSlice {
		p, err := sched.PlaceSlice(snap, sched.SliceRequest{SKU: sku, GPUCount: req.GPUCount, Region: req.Region})
		if err != nil {
			return proto.Allocation{}, false, err
		}
		nodeID, nodeIdx, slots = p.NodeID, p.NodeModifyIndex, p.Slots
	} else {
		p, err := sched.PlaceBaremetal(snap, sched.BaremetalRequest{SKU: sku, Region: req.Region})
		if err != nil {
			return proto.Allocation{}, false, err
		}
		nodeID, nodeIdx, slots = p.NodeID, p.NodeModifyIndex, p.Slots
	}
	id := "a-" + randomHex(6)
	claims := []string{"c-" + id[2:] + "-0"}
	if req.CapacityShape == proto.ShapeGPUSlice {
		claims = claims[:0]
		for i := range slots {
			claims = append(claims, fmt.Sprintf("c-%s-%d", id[2:], i))
		}
	}
	gpus := req.GPUCount
	if req.CapacityShape == proto.ShapeBaremetal && gpus == 0 {
		gpus = len(slots)
	}
	b.clock = b.clock.Add(time.Second)
	pr := proto.AllocationPlaceRequest{
		At: b.clock,
		Allocation: proto.Allocation{ID: id, IdempotencyKey: key, Owner: req.Owner, Shape: req.CapacityShape, SKU: req.SKU,
			GPUCount: gpus, Region: req.Region, Image: req.Image, SSHPublicKeys: req.SSHPublicKeys},
		NodeID: nodeID, NodeModifyIndex: nodeIdx, Slots: slots, ClaimIDs: claims,
		Task: proto.Task{ID: "t-" + id[2:] + "-p"},
	}
	rules, err := proto.ParseIngressRules(req.Ingress)
	if err != nil {
		return proto.Allocation{}, false, err
	}
	for _, r := range rules {
		pr.Allocation.Ingress = append(pr.Allocation.Ingress, proto.IngressRoute{Protocol: r.Protocol, Port: r.Port})
	}
	resp, _, err := b.applyLocked(proto.AllocationPlaceType, pr)
	if err != nil {
		return proto.Allocation{}, false, err
	}
	r := resp.(*proto.AllocationPlaceResponse)
	return r.Allocation, r.Existing, nil
}

// doRaw sends body as is with the headers in hdr (Content-Type only if
// hdr sets it) and validates the answer like do.
func (e *env) doRaw(role Role, method, path, body string, hdr ...string) resp {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	require.NoError(e.t, err)
	if role != 0 {
		req.Header.Set("Authorization", "Bearer "+e.tok[role])
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	require.NoError(e.t, err)
	r := resp{status: res.StatusCode, header: res.Header, body: out}
	e.validate(req, []byte(body), r)
	return r
}
