// Package membership is the gossip pool agents and coordinators share
// (hashicorp/memberlist, SWIM with Lifeguard). Agents join it so the
// coordinator learns of a dead host within seconds, at thousands of hosts,
// without per-node heartbeats through Raft; HTTP heartbeats remain the
// fallback. Every member carries small metadata: its role, node ID and,
// for an agent, a proof that it holds its node's enrollment credential.
//
// The pool is encrypted and authenticated with memberlist's keyring
// (AES-256-GCM, GossipVerifyIncoming/Outgoing): a process without a
// cluster gossip key cannot join, read or inject messages. Keys rotate
// live with SetKeyring (install a new key everywhere, make it primary,
// remove the old one).
package membership

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Role says what a member is.
type Role string

const (
	RoleAgent       Role = "agent"
	RoleCoordinator Role = "coordinator"
)

// Meta is gossiped with every member (memberlist caps it at 512 bytes).
type Meta struct {
	Role     Role   `json:"role"`
	NodeID   string `json:"node_id"`
	HTTPAddr string `json:"http_addr,omitempty"`
	// Proof is an agent's proof of its node's enrollment credential
	// (Prove): the coordinator acts on an agent member only when it checks
	// out against the credential hash the ledger holds for NodeID.
	Proof string `json:"proof,omitempty"`
	// Keyring is the version of the cluster gossip keyring this member
	// holds (0: unknown).
	Keyring uint64 `json:"keyring,omitempty"`
}

// EventKind is what happened to a member.
type EventKind string

const (
	EventJoin EventKind = "join"
	// EventGone: the member left or the failure detector declared it dead.
	// memberlist's NotifyLeave does not say which (the Node it passes never
	// has its State set), and for the coordinator both mean the agent is
	// unreachable until it joins again.
	EventGone   EventKind = "gone"
	EventUpdate EventKind = "update"
)

// Event is one membership change as this member saw it.
type Event struct {
	Kind EventKind
	Name string
	Addr string
	Meta Meta
	At   time.Time
}

// Config configures a member.
type Config struct {
	// Name is unique in the pool (agents use their node ID).
	Name string
	Meta Meta
	// BindAddr/BindPort for the real UDP+TCP transport; port 0 picks one.
	BindAddr string
	BindPort int
	// Transport replaces the network transport (memnet in scale tests).
	Transport memberlist.NodeAwareTransport
	// Profile tunes the failure detector; default ProfileFast.
	Profile Profile
	Logger  *slog.Logger
	// OnLog, when set, sees every memberlist log line (tests count
	// suspicions with it).
	OnLog func(line string)
	// Adjust, when set, changes the memberlist configuration after the
	// profile (the detection benchmark dilates time with it: Dilate).
	Adjust func(*memberlist.Config)
	// Keys is the gossip keyring, primary first (each 16, 24 or 32
	// bytes; the cluster uses 32, AES-256). Without keys the pool is
	// plaintext: only the in-process scale benchmark and unit tests run
	// so; the agent and coordinator binaries always pass keys.
	Keys [][]byte
	// Prove, when set, computes Meta.Proof from this member's gossip
	// address once it is bound (agents: ProveFunc).
	Prove func(addr string) string
}

// Dilate multiplies every interval and timeout of c by k, so a pool runs
// the same protocol k times slower: the same messages, the same
// suspicion arithmetic (its timeouts are multiples of the probe
// interval), at 1/k of the CPU per second. The benchmark runs pools too
// large for this machine's cores that way and divides the times it
// measures by k (time dilation, as in network emulation).
func Dilate(c *memberlist.Config, k float64) {
	d := func(v *time.Duration) { *v = time.Duration(float64(*v) * k) }
	d(&c.ProbeInterval)
	d(&c.ProbeTimeout)
	d(&c.GossipInterval)
	d(&c.PushPullInterval)
	d(&c.GossipToTheDeadTime)
	d(&c.TCPTimeout)
	d(&c.DeadNodeReclaimTime)
}

// Profile is a named failure-detector tuning.
type Profile string

const (
	// ProfileFast targets detection of a dead host in under 5 s at 1,000
	// members on a LAN: probe every 250 ms (150 ms ack timeout), suspicion
	// 3 × log10(N) probe intervals (2.25 s at 1,000, at most 4× that),
	// confirmations shortening it (Lifeguard); gossip every 200 ms to 4
	// members; push-pull every 15 s (memberlist scales it up with N);
	// no compression. Agents and coordinators use it at every pool size.
	ProfileFast Profile = "fast"
	// ProfileDefault is memberlist's DefaultLANConfig (about 12 s at 1,000).
	ProfileDefault Profile = "lan-default"
)

// Tune applies profile p to c.
func Tune(c *memberlist.Config, p Profile) error {
	switch p {
	case ProfileFast, "":
		c.ProbeInterval = 250 * time.Millisecond
		c.ProbeTimeout = 150 * time.Millisecond
		c.SuspicionMult = 3
		c.SuspicionMaxTimeoutMult = 4
		c.GossipInterval = 200 * time.Millisecond
		c.GossipNodes = 4
		c.PushPullInterval = 15 * time.Second
		c.GossipToTheDeadTime = 15 * time.Second
		c.TCPTimeout = 5 * time.Second
		// No LZW on the wire: pool messages are a few hundred bytes on a
		// LAN, and compress/lzw allocates ~20 KB of tables per packet. In
		// the scale benchmark (every member in one process) that garbage
		// stalled joins at ~130 members; without it 200 join in seconds
		// with no false suspicion. Members of a pool must agree: memberlist
		// decompresses whatever it receives, so mixed pools still work.
		c.EnableCompression = false
	case ProfileDefault:
	default:
		return fmt.Errorf("membership profile %q: want %q or %q", p, ProfileFast, ProfileDefault)
	}
	return nil
}

// Pool is this process's membership in the gossip pool.
type Pool struct {
	ml *memberlist.Memberlist
	kr *memberlist.Keyring // nil: a plaintext pool
	md *metaDelegate

	metaMu sync.Mutex
	meta   Meta // this member's metadata (without the encoding)
	name   string
	events chan Event
	log    *slog.Logger

	mu     sync.Mutex
	closed bool

	// view is what this member has learned of every other member, kept
	// by the event delegate (Statuses).
	vmu  sync.Mutex
	view map[string]Status
	seq  uint64
}

// Status is what this member last learned about another member: a
// level-triggered view beside the Events edge stream, so a watcher that
// missed events (it was not the Raft leader when they came) can still act
// on the member's current state.
type Status struct {
	Name  string
	Addr  string
	Meta  Meta
	Alive bool
	// Since is when this member saw the last change.
	Since time.Time
	// Seq is unique to each change this member saw and increases with
	// them, so a watcher can tell a change it already acted on from a
	// new one.
	Seq uint64
}

// Start creates the member. It does not join anyone yet: call Join.
func Start(cfg Config) (*Pool, error) {
	if cfg.Name == "" {
		return nil, fmt.Errorf("membership: a member name is required")
	}
	meta, err := json.Marshal(cfg.Meta)
	if err != nil {
		return nil, fmt.Errorf("membership %s: %w", cfg.Name, err)
	}
	if len(meta) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("membership %s: metadata is %d bytes, memberlist allows %d", cfg.Name, len(meta), memberlist.MetaMaxSize)
	}
	lg := cfg.Logger
	if lg == nil {
		lg = slog.Default()
	}
	p := &Pool{events: make(chan Event, 1024), log: lg.With("member", cfg.Name), name: cfg.Name, view: map[string]Status{}}

	c := memberlist.DefaultLANConfig()
	c.Name = cfg.Name
	if err := Tune(c, cfg.Profile); err != nil {
		return nil, err
	}
	if cfg.Adjust != nil {
		cfg.Adjust(c)
	}
	if cfg.Transport != nil {
		c.Transport = cfg.Transport
	} else {
		c.BindAddr = cfg.BindAddr
		if c.BindAddr == "" {
			c.BindAddr = "127.0.0.1"
		}
		c.BindPort = cfg.BindPort
		c.AdvertisePort = 0
	}
	if len(cfg.Keys) > 0 {
		kr, err := memberlist.NewKeyring(cfg.Keys[1:], cfg.Keys[0])
		if err != nil {
			return nil, fmt.Errorf("membership %s: keyring: %w", cfg.Name, err)
		}
		c.Keyring, p.kr = kr, kr
		c.GossipVerifyIncoming, c.GossipVerifyOutgoing = true, true
	}
	md := &metaDelegate{b: meta}
	c.Delegate = md
	c.Events = &eventDelegate{p: p}
	c.Logger = log.New(&logWriter{log: p.log, hook: cfg.OnLog}, "", 0)

	ml, err := memberlist.Create(c)
	if err != nil {
		return nil, fmt.Errorf("membership %s: %w", cfg.Name, err)
	}
	p.ml, p.md, p.meta = ml, md, cfg.Meta
	if cfg.Prove != nil {
		// The proof binds the address others see, known only now: gossip
		// the metadata again with it (before any Join, so no peer waits).
		if err := p.setMeta(func(m *Meta) { m.Proof = cfg.Prove(ml.LocalNode().Address()) }); err != nil {
			_ = ml.Shutdown()
			return nil, err
		}
	}
	return p, nil
}

// setMeta changes this member's metadata and gossips it.
func (p *Pool) setMeta(change func(*Meta)) error {
	p.metaMu.Lock()
	defer p.metaMu.Unlock()
	m := p.meta
	change(&m)
	b, err := json.Marshal(m)
	if err == nil && len(b) > memberlist.MetaMaxSize {
		err = fmt.Errorf("metadata is %d bytes, memberlist allows %d", len(b), memberlist.MetaMaxSize)
	}
	if err != nil {
		return fmt.Errorf("membership %s: %w", p.name, err)
	}
	p.md.set(b)
	if err := p.ml.UpdateNode(time.Second); err != nil {
		return fmt.Errorf("membership %s: update metadata: %w", p.name, err)
	}
	p.meta = m
	return nil
}

// SetKeyringVersion tells the pool which version of the cluster keyring
// this member holds (Meta.Keyring), so a rotation can wait until every
// live member has a new key before making it primary.
func (p *Pool) SetKeyringVersion(v uint64) error {
	return p.setMeta(func(m *Meta) { m.Keyring = v })
}

// SetKeyring makes this member's keyring keys (primary first) the way
// Consul rotates: every new key is installed, the first becomes primary,
// keys no longer listed are removed. A pool started without keys cannot
// start encrypting (memberlist fixes that at creation).
func (p *Pool) SetKeyring(keys [][]byte) error {
	kr := p.kr
	if kr == nil {
		return fmt.Errorf("membership %s: the pool was started without a gossip keyring", p.name)
	}
	if len(keys) == 0 {
		return fmt.Errorf("membership %s: an empty gossip keyring would stop encryption", p.name)
	}
	for _, k := range keys {
		if err := kr.AddKey(k); err != nil {
			return fmt.Errorf("membership %s: install gossip key: %w", p.name, err)
		}
	}
	if err := kr.UseKey(keys[0]); err != nil {
		return fmt.Errorf("membership %s: use gossip key: %w", p.name, err)
	}
	for _, have := range kr.GetKeys() {
		keep := false
		for _, k := range keys {
			keep = keep || hmac.Equal(k, have)
		}
		if !keep {
			if err := kr.RemoveKey(have); err != nil {
				return fmt.Errorf("membership %s: remove gossip key: %w", p.name, err)
			}
		}
	}
	return nil
}

// Keys returns this member's keyring, primary first (nil without one).
func (p *Pool) Keys() [][]byte {
	kr := p.kr
	if kr == nil {
		return nil
	}
	return kr.GetKeys()
}

// proofContext separates member proofs from any other use of the key.
const proofContext = "gpuaas gossip member proof v1"

// CredentialHash is the hex SHA-256 of a node credential: what the
// coordinator's enrollment table stores (coordinator/enroll.Hash) and the
// key of the member proof.
func CredentialHash(credential string) string {
	s := sha256.Sum256([]byte(credential))
	return hex.EncodeToString(s[:])
}

// Prove is an agent member's proof of its node's enrollment credential:
// HMAC-SHA256 keyed by the credential's hash over the node ID, the member
// name and the member's gossip address. Only the agent (which holds the
// credential) and the coordinators (which hold its hash) can compute it;
// binding the address means a copied proof does not make another
// address's member that node.
func Prove(credentialHash, nodeID, name, addr string) string {
	m := hmac.New(sha256.New, []byte(credentialHash))
	for _, part := range []string{proofContext, nodeID, name, addr} {
		m.Write([]byte(part))
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil))
}

// Verify reports whether st carries a valid proof of the credential whose
// hash is credentialHash for the node it names.
func Verify(credentialHash string, st Status) bool {
	if credentialHash == "" || st.Meta.Proof == "" {
		return false
	}
	want := Prove(credentialHash, st.Meta.NodeID, st.Name, st.Addr)
	return hmac.Equal([]byte(want), []byte(st.Meta.Proof))
}

// Join contacts existing members (host:port). It succeeds if any answers.
func (p *Pool) Join(addrs []string) (int, error) {
	n, err := p.ml.Join(addrs)
	if err != nil && n == 0 {
		return 0, fmt.Errorf("membership join %s: %w", strings.Join(addrs, ","), err)
	}
	return n, nil
}

// Addr is this member's gossip address (host:port).
func (p *Pool) Addr() string { return p.ml.LocalNode().Address() }

// Events delivers membership changes. Slow readers lose the oldest events
// after 1,024 pending; NumMembers/Members stay authoritative.
func (p *Pool) Events() <-chan Event { return p.events }

// Member is a live member.
type Member struct {
	Name string
	Addr string
	Meta Meta
}

// Members lists the members this member believes alive.
func (p *Pool) Members() []Member {
	var out []Member
	for _, n := range p.ml.Members() {
		out = append(out, Member{Name: n.Name, Addr: n.Address(), Meta: decodeMeta(n.Meta)})
	}
	return out
}

// NumMembers counts live members, this one included.
func (p *Pool) NumMembers() int { return p.ml.NumMembers() }

// Leave announces a graceful departure and stops.
func (p *Pool) Leave(timeout time.Duration) error {
	err := p.ml.Leave(timeout)
	if serr := p.Shutdown(); err == nil {
		err = serr
	}
	return err
}

// Shutdown stops without announcing (others will declare this member dead).
func (p *Pool) Shutdown() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	return p.ml.Shutdown()
}

// Statuses lists every member this member has seen (itself excluded),
// alive or gone, sorted by name. A gone member stays listed until it
// joins again.
func (p *Pool) Statuses() []Status {
	p.vmu.Lock()
	out := make([]Status, 0, len(p.view))
	for _, st := range p.view {
		out = append(out, st)
	}
	p.vmu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Suspects names the members memberlist currently suspects: alive as far
// as the pool's view goes, but a probe failed and the suspicion timeout
// runs (metrics: an agent about to be declared dead).
func (p *Pool) Suspects() map[string]bool {
	out := map[string]bool{}
	for _, n := range p.ml.Members() {
		if n.State == memberlist.StateSuspect {
			out[n.Name] = true
		}
	}
	return out
}

func (p *Pool) emit(kind EventKind, n *memberlist.Node) {
	ev := Event{Kind: kind, Name: n.Name, Addr: n.Address(), Meta: decodeMeta(n.Meta), At: time.Now()}
	if n.Name != p.name {
		p.vmu.Lock()
		p.seq++
		p.view[n.Name] = Status{Name: n.Name, Addr: ev.Addr, Meta: ev.Meta, Alive: kind != EventGone, Since: ev.At, Seq: p.seq}
		p.vmu.Unlock()
	}
	select {
	case p.events <- ev:
	default:
		select { // drop the oldest, keep the newest
		case <-p.events:
		default:
		}
		select {
		case p.events <- ev:
		default:
		}
	}
}

func decodeMeta(b []byte) Meta {
	var m Meta
	_ = json.Unmarshal(b, &m) // foreign or empty metadata decodes to zero
	return m
}

type eventDelegate struct{ p *Pool }

func (d *eventDelegate) NotifyJoin(n *memberlist.Node) { d.p.emit(EventJoin, n) }
func (d *eventDelegate) NotifyUpdate(n *memberlist.Node) {
	d.p.emit(EventUpdate, n)
}
func (d *eventDelegate) NotifyLeave(n *memberlist.Node) { d.p.emit(EventGone, n) }

// metaDelegate serves this member's metadata (set once more after
// creation when it carries a proof).
type metaDelegate struct {
	mu sync.Mutex
	b  []byte
}

func (m *metaDelegate) set(b []byte) {
	m.mu.Lock()
	m.b = b
	m.mu.Unlock()
}

func (m *metaDelegate) NodeMeta(limit int) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.b) > limit {
		return nil
	}
	return m.b
}
func (*metaDelegate) NotifyMsg([]byte)                {}
func (*metaDelegate) GetBroadcasts(int, int) [][]byte { return nil }
func (*metaDelegate) LocalState(bool) []byte          { return nil }
func (*metaDelegate) MergeRemoteState([]byte, bool)   {}

// logWriter routes memberlist's log lines to slog at debug level (warnings
// and errors at their level) and to an optional hook.
type logWriter struct {
	log  *slog.Logger
	hook func(string)
}

func (w *logWriter) Write(b []byte) (int, error) {
	line := strings.TrimSpace(string(b))
	if w.hook != nil {
		w.hook(line)
	}
	switch {
	case strings.Contains(line, "[ERR]"):
		w.log.Error(line)
	case strings.Contains(line, "[WARN]"):
		w.log.Debug(line) // suspicions are normal SWIM traffic
	default:
		w.log.Debug(line)
	}
	return len(b), nil
}

var _ io.Writer = (*logWriter)(nil)
