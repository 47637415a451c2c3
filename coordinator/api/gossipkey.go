package api

import (
	"net/http"

	"github.com/gpuaas/gpuaas/proto"
)

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
	return c.reply(http.StatusOK, k)
}

// gossipKeyOp answers POST /v1/operator/gossip-keys {"op", "key"}: install
// a key, use it as primary, or remove it (Consul's keyring model). Every
// coordinator applies the new keyring to its pool member within a second;
// agents take it with their next heartbeat.
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
	if _, err := a.enrollment(); err != nil {
		return err
	}
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
