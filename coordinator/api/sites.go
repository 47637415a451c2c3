package api

import (
	"net/http"
	"net/url"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// SiteSealer is implemented by a Backend that can seal site secrets
// (*server.Server with a site key). Credentials are sealed on the replica
// that handles the write — the leader — before they are proposed.
type SiteSealer interface {
	SealSiteSecret(site string, secret []byte) (*proto.SealedSecret, error)
}

func (a *API) putSite(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	name, err := c.pathID("name", "site name")
	if err != nil {
		return err
	}
	var body proto.SiteBody
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if body.Credentials != nil {
		return proto.Errorf(proto.CodeInvalidArgument, "credentials are sealed by the coordinator: send the MAAS key as maas_api_key")
	}
	if body.Ingress != nil {
		return proto.Errorf(proto.CodeInvalidArgument, "ingress is set with PUT /v1/sites/%s/ingress (a site upsert keeps the declaration)", name)
	}
	if body.Name != "" && body.Name != name {
		return proto.Errorf(proto.CodeInvalidArgument, "body name %q differs from the path's site %s", body.Name, name)
	}
	site := body.Site
	site.Name, site.Meta = name, proto.Meta{}
	if err := site.Validate(); err != nil {
		return err
	}
	if body.MAASAPIKey != "" {
		if err := proto.ValidateMAASAPIKey(body.MAASAPIKey); err != nil {
			return err
		}
		sealer, ok := a.b.(SiteSealer)
		if !ok {
			return proto.Errorf(proto.CodeUnavailable, "this coordinator cannot seal site credentials")
		}
		if site.Credentials, err = sealer.SealSiteSecret(name, []byte(body.MAASAPIKey)); err != nil {
			return err
		}
	}
	if err := c.apply(proto.SiteUpsertType, proto.SiteUpsertRequest{At: now(), Site: site}); err != nil {
		return err
	}
	s, ok := a.b.Store().Snapshot().Site(name)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "site %s does not exist", name)
	}
	return c.reply(http.StatusOK, proto.ViewOf(s))
}

func (a *API) getSite(c *call) error {
	o := readOpts{tables: []string{state.TableSites}, block: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, _ page) (any, error) {
		name, err := c.pathID("name", "site name")
		if err != nil {
			return nil, err
		}
		si, ok := s.Site(name)
		if !ok {
			return nil, proto.Errorf(proto.CodeNotFound, "site %s does not exist", name)
		}
		return proto.ViewOf(si), nil
	})
}

func (a *API) putSiteProfile(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	site, err := c.pathID("name", "site name")
	if err != nil {
		return err
	}
	name, err := c.pathID("profile", "profile name")
	if err != nil {
		return err
	}
	var p proto.SiteProfile
	if err := c.decode(&p, false); err != nil {
		return err
	}
	if p.Site != "" && p.Site != site || p.Name != "" && p.Name != name {
		return proto.Errorf(proto.CodeInvalidArgument, "body names profile %s/%s; the path names %s/%s", p.Site, p.Name, site, name)
	}
	p.Site, p.Name, p.Meta = site, name, proto.Meta{}
	if err := p.Validate(); err != nil {
		return err
	}
	if err := c.apply(proto.SiteProfileUpsertType, proto.SiteProfileUpsertRequest{At: now(), Profile: p}); err != nil {
		return err
	}
	got, ok := a.b.Store().Snapshot().SiteProfile(site, name)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "profile %s/%s does not exist", site, name)
	}
	return c.reply(http.StatusOK, got)
}

func (a *API) getSiteProfile(c *call) error {
	o := readOpts{tables: []string{state.TableSiteProfiles}, block: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, _ page) (any, error) {
		site, err := c.pathID("name", "site name")
		if err != nil {
			return nil, err
		}
		name, err := c.pathID("profile", "profile name")
		if err != nil {
			return nil, err
		}
		p, ok := s.SiteProfile(site, name)
		if !ok {
			return nil, proto.Errorf(proto.CodeNotFound, "profile %s/%s does not exist", site, name)
		}
		return p, nil
	})
}
