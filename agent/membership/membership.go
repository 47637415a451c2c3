// Package membership is the gossip pool agents and coordinators share
// (hashicorp/memberlist, SWIM with Lifeguard). Agents join it so the
// coordinator learns of a dead host within seconds, at thousands of hosts,
// without per-node heartbeats through Raft; HTTP heartbeats remain the
// fallback. Every member carries small metadata: its role and node ID.
package membership

import (
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
	ml     *memberlist.Memberlist
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
	c.Delegate = metaDelegate(meta)
	c.Events = &eventDelegate{p: p}
	c.Logger = log.New(&logWriter{log: p.log, hook: cfg.OnLog}, "", 0)

	ml, err := memberlist.Create(c)
	if err != nil {
		return nil, fmt.Errorf("membership %s: %w", cfg.Name, err)
	}
	p.ml = ml
	return p, nil
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

type metaDelegate []byte

func (m metaDelegate) NodeMeta(limit int) []byte {
	if len(m) > limit {
		return nil
	}
	return m
}
func (metaDelegate) NotifyMsg([]byte)                {}
func (metaDelegate) GetBroadcasts(int, int) [][]byte { return nil }
func (metaDelegate) LocalState(bool) []byte          { return nil }
func (metaDelegate) MergeRemoteState([]byte, bool)   {}

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
