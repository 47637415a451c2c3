package api

import (
	"net/http"
	"sort"
	"strings"

	"github.com/gpuaas/gpuaas/proto"
)

// gossipPool is a backend in the agents' gossip pool (*server.Server).
type gossipPool interface {
	GossipKeyringLag(v uint64) (lagging []string, live int, ok bool)
	GossipKeyringMembers() map[uint64]int
}

// checkKeyringHeld refuses a `use` or `remove` while live pool members do
// not hold keyring version v.
func (a *API) checkKeyringHeld(v uint64) error {
	p, ok := a.b.(gossipPool)
	if !ok {
		return nil
	}
	lagging, live, in := p.GossipKeyringLag(v)
	if !in || len(lagging) == 0 {
		return nil
	}
	sort.Strings(lagging)
	if len(lagging) > 10 {
		lagging = append(lagging[:10], "…")
	}
	return proto.Errorf(proto.CodeConflict, "%d of %d live gossip members do not hold keyring version %d yet (%s); agents take it with their next heartbeat: retry, or force",
		len(lagging), live, v, strings.Join(lagging, ", "))
}

// gossipKeyring is the replicated gossip keyring agents are given, nil
// while the cluster has none.
func (a *API) gossipKeyring() *proto.GossipKeyring {
	tab, err := a.enrollment()
	if err != nil {
		return nil
	}
	k := tab.GossipKeyring()
	if k.Version == 0 {
		return nil
	}
	return &k
}

// listGossipKeys answers GET /v1/operator/gossip-keys: the cluster's
// gossip keyring (admin only: the keys are secrets).
func (a *API) listGossipKeys(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	tab, err := a.enrollment()
	if err != nil {
		return err
	}
	c.index = a.b.Store().Snapshot().Index()
	k := tab.GossipKeyring()
	if k.Keys == nil {
		k.Keys = []string{}
	}
	view := proto.GossipKeyringView{GossipKeyring: k}
	if p, ok := a.b.(gossipPool); ok {
		if _, _, in := p.GossipKeyringLag(0); in {
			view.Members = p.GossipKeyringMembers()
		}
	}
	return c.reply(http.StatusOK, view)
}

// gossipKeyOp answers POST /v1/operator/gossip-keys {"op", "key"}: install
// a key, use it as primary, or remove it (Consul's keyring model). Every
// coordinator applies the new keyring to its pool member within a second;
// agents take it with their next heartbeat. use and remove wait (409)
// until every live member advertises the current keyring, unless forced.
func (a *API) gossipKeyOp(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	var body proto.GossipKeyringOpRequest
	if err := c.decode(&body, false); err != nil {
		return err
	}
	switch body.Op {
	case proto.GossipKeyInstall, proto.GossipKeyUse, proto.GossipKeyRemove:
	default:
		return proto.Errorf(proto.CodeInvalidArgument, "op %q: want install, use or remove", body.Op)
	}
	if _, err := proto.DecodeGossipKey(body.Key); err != nil {
		return err
	}
	tab, err := a.enrollment()
	if err != nil {
		return err
	}
	if (body.Op == proto.GossipKeyUse || body.Op == proto.GossipKeyRemove) && !body.Force {
		// use: a member without the new key could not read the others;
		// remove: a member still encrypting with the old primary would be
		// cut off. Both wait until every live member holds the keyring.
		if err := a.checkKeyringHeld(tab.GossipKeyring().Version); err != nil {
			return err
		}
	}
	body.Force = false
	body.At = a.now()
	resp, idx, err := a.b.Apply(c.r.Context(), proto.GossipKeyringOpType|proto.IgnoreUnknownTypeFlag, body)
	if err != nil {
		return err
	}
	c.index = idx
	k, ok := resp.(*proto.GossipKeyring)
	if !ok || k == nil {
		return proto.Errorf(proto.CodeInternal, "gossip keyring op answered %T", resp)
	}
	a.log.Info("gossip keyring changed", "op", body.Op, "by", c.p.Name, "version", k.Version, "keys", len(k.Keys))
	return c.reply(http.StatusOK, k)
}
