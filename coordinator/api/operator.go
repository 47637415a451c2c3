package api

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

func (a *API) getStatus(c *call) error {
	return c.read(readOpts{replica: true}, func(s *state.Snapshot, _ url.Values, _ page) (any, error) {
		st := proto.Status{IsLeader: a.b.IsLeader(), LeaderHTTPAddr: a.b.LeaderHTTPAddr(), Index: c.index}
		if b, ok := a.b.(auditRetentionBackend); ok {
			if r := b.AuditRetention(); r.Blocked {
				st.Warnings = append(st.Warnings, r.Warning)
			}
		}
		return st, nil
	})
}

// whoami names the caller's principal and role and lists every route
// the same role rule (permits) lets it call, as "METHOD PATTERN": the web
// console shows write controls from this list instead of re-deriving
// roles.
func (a *API) whoami(c *call) error {
	return c.read(readOpts{}, func(s *state.Snapshot, _ url.Values, _ page) (any, error) {
		w := proto.WhoAmI{Name: c.p.Name, Role: c.p.Role.String(), Routes: []string{}}
		for _, rt := range a.routes {
			if permits(c.p, rt) {
				w.Routes = append(w.Routes, rt.Method+" "+rt.Pattern)
			}
		}
		slices.Sort(w.Routes)
		return w, nil
	})
}

// peers answers with the Raft configuration sorted by ID: the whole of
// it (a write's answer) or one page of a list.
func (c *call) peers(pg ...page) error {
	ps, err := c.a.b.Peers()
	if err != nil {
		return err
	}
	items := make([]*Peer, len(ps))
	for i := range ps {
		items[i] = &ps[i]
	}
	slices.SortFunc(items, func(x, y *Peer) int { return strings.Compare(x.ID, y.ID) })
	next := ""
	if len(pg) > 0 {
		items, next = cut(items, func(p *Peer) string { return p.ID }, pg[0])
	}
	c.index = c.a.b.Store().Snapshot().Index()
	return c.reply(http.StatusOK, list(items, next, c.index))
}

func (a *API) listPeers(c *call) error {
	q, err := c.query(append(append([]string(nil), readParams...), pagingParams...)...)
	if err != nil {
		return err
	}
	p, err := pageParams(q)
	if err != nil {
		return err
	}
	return c.peers(p)
}

func validHostPort(what, v string) error {
	host, port, err := net.SplitHostPort(v)
	if err != nil || host == "" || port == "" || len(v) > 256 {
		return proto.Errorf(proto.CodeInvalidArgument, "%s %q is not host:port", what, v)
	}
	return nil
}

func (a *API) addPeer(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	var body proto.PeerAddBody
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if err := proto.ValidateID("id", body.ID); err != nil {
		return err
	}
	if err := validHostPort("raft_addr", body.RaftAddr); err != nil {
		return err
	}
	if err := validHostPort("http_addr", body.HTTPAddr); err != nil {
		return err
	}
	if err := a.b.AddVoter(c.r.Context(), body.ID, body.RaftAddr, body.HTTPAddr); err != nil {
		return err
	}
	return c.peers()
}

func (a *API) removePeer(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	id, err := c.pathID("id", "server id")
	if err != nil {
		return err
	}
	if err := a.b.RemoveServer(c.r.Context(), id); err != nil {
		return err
	}
	return c.peers()
}

func (a *API) transferLeadership(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	var body proto.TransferLeadershipBody
	if err := c.decode(&body, true); err != nil {
		return err
	}
	if body.ID != "" {
		if err := proto.ValidateID("id", body.ID); err != nil {
			return err
		}
	}
	if err := a.b.TransferLeadership(c.r.Context(), body.ID); err != nil {
		return err
	}
	return c.peers()
}

// JoinTokenBackend is a Backend that mints server join tokens
// (*server.Server is one). The route answers 503 without it.
type JoinTokenBackend interface {
	MintJoinToken(ctx context.Context, serverID string, ttl time.Duration, by string) (proto.JoinTokenResponse, error)
}

// createJoinToken mints a single-use join token a new coordinator
// presents (-join-token-file) to become a voter. Shown once.
func (a *API) createJoinToken(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	var body proto.JoinTokenCreateBody
	if err := c.decode(&body, true); err != nil {
		return err
	}
	if body.ServerID != "" {
		if err := proto.ValidateID("server_id", body.ServerID); err != nil {
			return err
		}
	}
	ttl := proto.DefaultJoinTokenTTL
	if body.TTLSeconds != 0 {
		ttl = time.Duration(body.TTLSeconds) * time.Second
	}
	if ttl <= 0 || ttl > proto.MaxJoinTokenTTL {
		return proto.Errorf(proto.CodeInvalidArgument, "ttl_seconds %d is outside 1..%d", body.TTLSeconds, int(proto.MaxJoinTokenTTL/time.Second))
	}
	jb, ok := a.b.(JoinTokenBackend)
	if !ok {
		return proto.Errorf(proto.CodeUnavailable, "this coordinator does not mint join tokens")
	}
	resp, err := jb.MintJoinToken(c.r.Context(), body.ServerID, ttl, c.p.Name)
	if err != nil {
		return err
	}
	c.index = a.b.Store().Snapshot().Index()
	return c.reply(http.StatusCreated, resp)
}
