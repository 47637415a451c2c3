package api

import (
	"net/http"
	"net/url"
	"strconv"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// The bundle store and the node bootstrap protocol. Operators publish
// bundles (admin) and read their records (viewer); a deploying node
// fetches a bundle's bytes and posts its progress with its bootstrap
// token, which stays usable (spent or not) until it expires.

// bundleRecord is a bundle without its content.
func bundleRecord(b *proto.Bundle) *proto.Bundle {
	out := *b
	out.Content = nil
	return &out
}

func (a *API) publishBundle(c *call) error {
	q, err := c.query("name", "kind")
	if err != nil {
		return err
	}
	b := proto.Bundle{Name: q.Get("name"), Kind: proto.BundleKind(q.Get("kind")), Content: c.body,
		Digest: proto.BundleDigest(c.body), Size: int64(len(c.body))}
	if err := b.Validate(); err != nil {
		return err
	}
	_, existed := a.b.Store().Snapshot().Bundle(b.Digest)
	if existed {
		c.okStatusIs(http.StatusOK)
	}
	if err := c.apply(proto.BundlePublishType, proto.BundlePublishRequest{At: now(), Bundle: b}); err != nil {
		return err
	}
	got, ok := a.b.Store().Snapshot().Bundle(b.Digest)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "bundle %s does not exist", b.Digest)
	}
	status := http.StatusCreated
	if existed {
		status = http.StatusOK
	}
	return c.reply(status, bundleRecord(got))
}

func (a *API) listBundles(c *call) error {
	o := readOpts{tables: []string{state.TableBundles}, block: true, paging: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, p page) (any, error) {
		var out []*proto.Bundle
		for _, b := range s.Bundles() {
			out = append(out, bundleRecord(b))
		}
		items, next := cut(out, func(b *proto.Bundle) string { return b.Digest }, p)
		return list(items, next, c.index), nil
	})
}

func bundleDigest(c *call) (string, error) {
	d := c.r.PathValue("digest")
	if d == "" || proto.ValidateBundleRef("bundle digest", d) != nil {
		return "", proto.Errorf(proto.CodeInvalidArgument, "bundle digest %q is not sha256:<64 hex digits>", trunc(d, 80))
	}
	return d, nil
}

func (a *API) getBundle(c *call) error {
	o := readOpts{tables: []string{state.TableBundles}, block: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, _ page) (any, error) {
		d, err := bundleDigest(c)
		if err != nil {
			return nil, err
		}
		b, ok := s.Bundle(d)
		if !ok {
			return nil, proto.Errorf(proto.CodeNotFound, "bundle %s does not exist", d)
		}
		return bundleRecord(b), nil
	})
}

// bootstrapNode authenticates the call's bearer as a bootstrap token and
// returns its node.
func (a *API) bootstrapNode(c *call) (string, error) {
	tab, err := a.enrollment()
	if err != nil {
		return "", err
	}
	tok, ok := bearer(c.r)
	if !ok {
		c.w.Header().Set("WWW-Authenticate", `Bearer realm="gpuaas-bootstrap"`)
		return "", proto.Errorf(proto.CodeUnauthenticated, "an Authorization: Bearer <bootstrap token> header is required")
	}
	node, ok := tab.BootstrapNode(tok, a.now())
	if !ok {
		return "", proto.Errorf(proto.CodeUnauthenticated, "the bootstrap token is unknown or expired")
	}
	return node, nil
}

func (a *API) bootstrapPing(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	return c.reply(http.StatusOK, map[string]bool{"ok": true})
}

// bootstrapReportBody is what gpuaas-bootstrap posts.
type bootstrapReportBody struct {
	NodeID     string                `json:"node_id"`
	WorkflowID string                `json:"workflow_id,omitempty"`
	Phase      proto.BootstrapPhase  `json:"phase"`
	Status     proto.BootstrapStatus `json:"status"`
	Detail     string                `json:"detail,omitempty"`
	IBPorts    []proto.IBPortState   `json:"ib_ports,omitempty"`
}

func (a *API) bootstrapReport(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	node, err := a.bootstrapNode(c)
	if err != nil {
		return err
	}
	var body bootstrapReportBody
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if body.NodeID != node {
		return proto.Errorf(proto.CodeForbidden, "the bootstrap token is node %s's, not %s's", node, trunc(body.NodeID, 128))
	}
	tok, _ := bearer(c.r)
	rep := proto.BootstrapReport{WorkflowID: body.WorkflowID, Phase: body.Phase, Status: body.Status, Detail: body.Detail, IBPorts: body.IBPorts}
	if err := rep.Validate(); err != nil {
		return err
	}
	req := proto.NodeBootstrapReportRequest{At: a.now(), NodeID: node, TokenHash: enroll.Hash(tok), Report: rep}
	_, idx, err := a.b.Apply(c.r.Context(), proto.NodeBootstrapReportType|proto.IgnoreUnknownTypeFlag, req)
	if err != nil {
		return err
	}
	c.index = idx
	return c.reply(http.StatusAccepted, map[string]string{"node_id": node, "phase": string(rep.Phase), "status": string(rep.Status)})
}

// bundleReader reports whether tok is an operator token (role viewer or
// more) or an enrolled node's credential (the node.validate task).
func (a *API) bundleReader(tok string) bool {
	if tok == "" {
		return false
	}
	if p, ok := a.authenticate(tok); ok && p.Role >= RoleViewer {
		return true
	}
	if tab, err := a.enrollment(); err == nil {
		_, ok := tab.Authenticate(tok)
		return ok
	}
	return false
}

// bundleContent serves a bundle's bytes to a node holding its bootstrap
// token or its credential, or to an operator (role viewer).
func (a *API) bundleContent(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	d, err := bundleDigest(c)
	if err != nil {
		return err
	}
	tok, _ := bearer(c.r)
	if !a.bundleReader(tok) {
		if _, err := a.bootstrapNode(c); err != nil {
			if proto.CodeOf(err) == proto.CodeUnauthenticated && !a.b.IsLeader() && c.r.Header.Get(proto.ForwardedHeader) == "" {
				// A token minted a moment ago may not have reached this
				// replica yet: the leader, which minted it, decides.
				a.forward(c, nil)
				return nil
			}
			return err
		}
	}
	b, ok := a.b.Store().Snapshot().Bundle(d)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "bundle %s does not exist", d)
	}
	c.w.Header().Set("Content-Type", "application/octet-stream")
	c.w.Header().Set("Content-Length", strconv.Itoa(len(b.Content)))
	c.w.Header().Set(proto.IndexHeader, strconv.FormatUint(b.ModifyIndex, 10))
	c.w.WriteHeader(http.StatusOK)
	_, err = c.w.Write(b.Content)
	if err != nil {
		a.log.Warn("serve bundle", "digest", d, "err", err)
	}
	return nil
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
