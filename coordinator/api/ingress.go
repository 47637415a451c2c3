package api

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Public ingress routes (proto/ingress.go): an admin declares a site's
// public addressing; a tenant (or an operator) adds and removes ingress
// rules of its own allocation and reads their endpoints. The ledger hands
// out the endpoints and enforces the quota in the apply; the owning agent
// programs the rules and reports their state.

func (a *API) putSiteIngress(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	name, err := c.pathID("name", "site name")
	if err != nil {
		return err
	}
	var body proto.SiteIngressBody
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if body.Ingress != nil {
		if err := body.Ingress.Validate(name); err != nil {
			return err
		}
	}
	if err := c.apply(proto.SiteIngressSetType, proto.SiteIngressSetRequest{At: now(), Site: name, Ingress: body.Ingress}); err != nil {
		return err
	}
	s, ok := a.b.Store().Snapshot().Site(name)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "site %s does not exist", name)
	}
	return c.reply(http.StatusOK, proto.ViewOf(s))
}

// ingressView answers the routes of allocation id with the site that
// hands out its endpoints.
func ingressView(s *state.Snapshot, id string) (proto.IngressView, error) {
	al, ok := s.Allocation(id)
	if !ok {
		return proto.IngressView{}, proto.Errorf(proto.CodeNotFound, "allocation %s does not exist", id)
	}
	v := proto.IngressView{AllocationID: id, Routes: al.Ingress, Site: SiteOfNode(s, al.NodeID)}
	if v.Routes == nil {
		v.Routes = []proto.IngressRoute{}
	}
	return v, nil
}

// SiteOfNode names the site one of whose profiles maps the node's pool
// ("" when none does).
func SiteOfNode(s *state.Snapshot, nodeID string) string {
	n, ok := s.Node(nodeID)
	if !ok {
		return ""
	}
	for _, site := range s.Sites() {
		for _, pool := range site.Profiles {
			if pool == n.Pool {
				return site.Name
			}
		}
	}
	return ""
}

func (a *API) getIngress(c *call) error {
	o := readOpts{tables: []string{state.TableAllocations}, block: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, _ page) (any, error) {
		id, err := c.pathID("id", "allocation id")
		if err != nil {
			return nil, err
		}
		return ingressView(s, id)
	})
}

func (a *API) addIngress(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	id, err := c.pathID("id", "allocation id")
	if err != nil {
		return err
	}
	var body proto.IngressBody
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if len(body.Rules) == 0 {
		return proto.Errorf(proto.CodeInvalidArgument, "rules is empty: name at least one, e.g. {\"rules\": [\"tcp/22\"]}")
	}
	rules, err := proto.ParseIngressRules(body.Rules)
	if err != nil {
		return err
	}
	if err := c.apply(proto.IngressAddType, proto.IngressAddRequest{At: now(), AllocationID: id, Rules: rules}); err != nil {
		return err
	}
	v, err := ingressView(a.b.Store().Snapshot(), id)
	if err != nil {
		return err
	}
	return c.reply(http.StatusOK, v)
}

func (a *API) removeIngress(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	id, err := c.pathID("id", "allocation id")
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(c.r.PathValue("port"))
	if err != nil {
		p := c.r.PathValue("port")
		if len(p) > 16 {
			p = p[:16] + "..."
		}
		return proto.Errorf(proto.CodeInvalidArgument, "port %q is not a number", p)
	}
	rule := proto.IngressRule{Protocol: c.r.PathValue("protocol"), Port: port}
	if err := rule.Validate(); err != nil {
		return err
	}
	var empty struct{}
	if err := c.decode(&empty, true); err != nil {
		return err
	}
	if err := c.apply(proto.IngressRemoveType, proto.IngressRemoveRequest{At: now(), AllocationID: id, Rules: []proto.IngressRule{rule}}); err != nil {
		return err
	}
	v, err := ingressView(a.b.Store().Snapshot(), id)
	if err != nil {
		return err
	}
	return c.reply(http.StatusOK, v)
}

// ingressOffer is the region's public ingress as a tenant sees it: the
// declaration of the first site (by name) of the region that has one.
func ingressOffer(s *state.Snapshot, region string) *proto.IngressOffer {
	var sites []string
	for _, site := range s.Sites() {
		if site.Region != region {
			continue
		}
		sites = append(sites, site.Name)
		if in := site.Ingress; in != nil {
			return &proto.IngressOffer{Enabled: true, Protocols: in.Protocols, AllowedPorts: in.AllowedPorts, QuotaPerTenant: in.QuotaPerTenant}
		}
	}
	if len(sites) == 0 {
		return &proto.IngressOffer{Reason: "no site of region " + region + " declares public addressing"}
	}
	return &proto.IngressOffer{Reason: "site " + strings.Join(sites, ", ") + " declares no public addressing"}
}
