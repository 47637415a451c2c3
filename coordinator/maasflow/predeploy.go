package maasflow

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/maas"
	"github.com/gpuaas/gpuaas/proto"
)

// Image kinds of the host image catalog: a MAAS custom image is a tgz root
// filesystem (maas_tgz); a full-disk image (maas_ddgz) is refused on the
// flat-storage path (seed 002: curtin fails at GRUB/EFI).
const (
	ImageKindMAASTgz  = "maas_tgz"
	ImageKindMAASDdgz = "maas_ddgz"
)

// HostImage is the MAAS image an approved catalog entry deploys.
type HostImage struct {
	Name    string // MAAS boot resource name (custom image)
	Version string
	Kind    string // ImageKindMAASTgz or ImageKindMAASDdgz
	SHA256  string
}

// ImageCatalog answers which host image a site profile deploys. The image
// catalog of the ledger implements it; without one (nil) the stock
// distro series is deployed and the image check says so.
type ImageCatalog interface {
	// ApprovedHostImage returns the host image approved for site/profile;
	// ok is false when none is.
	ApprovedHostImage(site, profile string) (img HostImage, ok bool, err error)
}

// ErrNoHostImages is what an ImageCatalog answers when it holds no MAAS
// host image at all: the site has not adopted custom host images and the
// stock distro series is deployed. Once any host image is published, a
// profile without an approved one is refused.
var ErrNoHostImages = errors.New("the image catalog holds no host image")

// maxUserData bounds the rendered cloud-init document.
const maxUserData = 64 << 10

// predeployInput is what the six checks look at: the exact inputs of the
// deploy call about to be made.
type predeployInput struct {
	site     *proto.Site
	profile  *proto.SiteProfile
	ud       UserData
	rendered []byte
	mintedAt time.Time
}

// predeploy runs the six predeploy checks of seed 002 and returns their
// results in order and the image to deploy (nil: the stock series). A
// failed check stops the workflow before the deploy call.
func (r *Runner) predeploy(ctx context.Context, mc *maas.Client, w *proto.MAASWorkflow, in predeployInput) ([]proto.CheckResult, *HostImage) {
	now := r.now()
	res := func(name string, err error, okDetail string) proto.CheckResult {
		c := proto.CheckResult{Name: name, OK: err == nil, Detail: okDetail, At: now}
		if err != nil {
			c.Detail = err.Error()
		}
		c.Detail = truncate(c.Detail, proto.MaxPredeployCheckDetail)
		return c
	}
	hc, caErr := r.bootstrapHTTPClient(in.site)
	var out []proto.CheckResult

	// 1. The bootstrap endpoint answers at the URL the node is given.
	pingURL := strings.TrimSuffix(in.ud.CoordinatorURL, "/") + proto.BootstrapPingPath
	err := caErr
	if err == nil {
		err = r.ping(ctx, hc, pingURL)
	}
	out = append(out, res(proto.CheckEndpointReachable, err, "GET "+pingURL+" answered 200"))

	// 2. Every bundle the node will fetch is fetchable at its exact URL,
	// with the node's own token, and has the digest its reference names.
	detail := "no bundles referenced"
	var fetched []string
	err = caErr
	for _, ref := range []string{in.profile.SiteBootstrapBundleRef, in.profile.PostDeployValidationBundleRef} {
		if ref == "" || err != nil {
			continue
		}
		if err = r.fetchBundle(ctx, hc, in.ud.CoordinatorURL, ref, in.ud.Token); err == nil {
			fetched = append(fetched, ref[:len("sha256:")+12])
		}
	}
	if len(fetched) > 0 {
		detail = "fetched and verified " + strings.Join(fetched, ", ")
	}
	out = append(out, res(proto.CheckBundleFetchable, err, detail))

	// 3. The CA bundle is real and final.
	caDetail, err := checkCABundle(r.caBundle(in.site), in.ud.CoordinatorURL, now)
	out = append(out, res(proto.CheckCABundleFinal, err, caDetail))

	// 4. The token in the user-data is the one the enrollment table holds
	// for this node: unused, expiring after the profile's TTL.
	out = append(out, res(proto.CheckTokenConsistent, r.checkToken(w, in), fmt.Sprintf("token for %s recorded, unused, TTL %ds", w.Hostname, in.profile.EnrollmentTokenTTLSeconds)))

	// 5. The site/profile bootstrap inputs resolve in the ledger.
	out = append(out, res(proto.CheckInputsResolve, r.checkInputs(in), "bundle refs resolve to published bundles of their kind; user-data renders"))

	// 6. The image exists and is approved for the site.
	img, imgDetail, err := r.checkImage(ctx, mc, in)
	out = append(out, res(proto.CheckImageApproved, err, imgDetail))
	return out, img
}

// caBundle is the CA bundle nodes of site trust: the site's own, else
// the cluster CA.
func (r *Runner) caBundle(site *proto.Site) string {
	if site.CABundle != "" {
		return site.CABundle
	}
	return r.cfg.ClusterCA
}

// bootstrapHTTPClient is the client the checks fetch with: the site's CA
// bundle is its trust root for an https coordinator URL.
func (r *Runner) bootstrapHTTPClient(site *proto.Site) (*http.Client, error) {
	if r.cfg.HTTPClient != nil {
		return r.cfg.HTTPClient, nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if b := r.caBundle(site); b != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(b)) {
			return nil, fmt.Errorf("site %s ca_bundle holds no usable certificate", site.Name)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}, nil
}

func (r *Runner) ping(ctx context.Context, hc *http.Client, u string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("ping %s: %w", u, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("bootstrap endpoint unreachable: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("bootstrap endpoint %s answered %s", u, resp.Status)
	}
	return nil
}

// fetchBundle GETs a bundle as the node will and compares its digest.
func (r *Runner) fetchBundle(ctx context.Context, hc *http.Client, base, ref, token string) error {
	u := strings.TrimSuffix(base, "/") + proto.BundleContentPath(ref)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("fetch bundle %s: %w", ref, err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("fetch bundle %s: %w", ref, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("fetch bundle %s: %s: %s", ref, resp.Status, strings.TrimSpace(string(b)))
	}
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(resp.Body, proto.MaxBundleBytes+1))
	if err != nil {
		return fmt.Errorf("fetch bundle %s: %w", ref, err)
	}
	if n > proto.MaxBundleBytes {
		return fmt.Errorf("fetch bundle %s: over %d bytes", ref, proto.MaxBundleBytes)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != ref {
		return fmt.Errorf("bundle digest mismatch: %s serves %d bytes with digest %s", u, n, got)
	}
	return nil
}

// checkCABundle: with a CA bundle, every block a certificate valid now
// and no template placeholder; an https coordinator needs one.
func checkCABundle(b, coordinatorURL string, now time.Time) (string, error) {
	if strings.TrimSpace(b) == "" {
		if strings.HasPrefix(coordinatorURL, "https://") {
			return "", fmt.Errorf("no ca_bundle on the site, but nodes reach the coordinator over https")
		}
		return "no ca_bundle (the coordinator URL is plain http)", nil
	}
	for _, p := range []string{"{{", "}}", "REPLACE", "PLACEHOLDER", "CHANGEME", "TODO"} {
		if strings.Contains(strings.ToUpper(b), p) {
			return "", fmt.Errorf("ca_bundle holds the template placeholder %q", p)
		}
	}
	rest := []byte(b)
	n := 0
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		n++
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil || blk.Type != "CERTIFICATE" {
			return "", fmt.Errorf("ca_bundle block %d is not a certificate", n)
		}
		if now.Before(c.NotBefore) || now.After(c.NotAfter) {
			return "", fmt.Errorf("ca_bundle certificate %d (%s) is valid %s..%s, not now", n, c.Subject.CommonName,
				c.NotBefore.Format(time.RFC3339), c.NotAfter.Format(time.RFC3339))
		}
	}
	if n == 0 || strings.TrimSpace(string(rest)) != "" {
		return "", fmt.Errorf("ca_bundle is not a list of PEM certificates")
	}
	return fmt.Sprintf("%d certificate(s), valid now", n), nil
}

func (r *Runner) checkToken(w *proto.MAASWorkflow, in predeployInput) error {
	ttl := time.Duration(in.profile.EnrollmentTokenTTLSeconds) * time.Second
	if ttl <= 0 {
		return fmt.Errorf("enrollment_token_ttl_seconds %d is not positive", in.profile.EnrollmentTokenTTLSeconds)
	}
	if !strings.Contains(string(in.rendered), "GPUAAS_BOOTSTRAP_TOKEN="+in.ud.Token+"\n") {
		return fmt.Errorf("the rendered user-data does not carry the minted token")
	}
	if r.cfg.Token == nil {
		return fmt.Errorf("no enrollment table on this runner to verify the token against")
	}
	tok, ok := r.cfg.Token(enroll.Hash(in.ud.Token))
	switch {
	case !ok:
		return fmt.Errorf("the bootstrap token of the user-data is not in the enrollment table")
	case tok.NodeID != w.Hostname:
		return fmt.Errorf("the bootstrap token is recorded for node %s, not %s", tok.NodeID, w.Hostname)
	case tok.UsedAt != nil:
		return fmt.Errorf("the bootstrap token was already used at %s", tok.UsedAt.Format(time.RFC3339))
	case !tok.ExpiresAt.Equal(in.mintedAt.Add(ttl)):
		return fmt.Errorf("the bootstrap token expires at %s, not mint time + enrollment_token_ttl_seconds (%s)",
			tok.ExpiresAt.Format(time.RFC3339), in.mintedAt.Add(ttl).Format(time.RFC3339))
	case !r.now().Before(tok.ExpiresAt):
		return fmt.Errorf("the bootstrap token already expired at %s", tok.ExpiresAt.Format(time.RFC3339))
	}
	return nil
}

func (r *Runner) checkInputs(in predeployInput) error {
	snap := r.cfg.Ledger.Store().Snapshot()
	for _, ref := range []struct {
		field, ref string
		kind       proto.BundleKind
	}{
		{"site_bootstrap_bundle_ref", in.profile.SiteBootstrapBundleRef, proto.BundleSiteBootstrap},
		{"commissioning_bundle_ref", in.profile.CommissioningBundleRef, proto.BundleCommissioning},
		{"post_deploy_validation_bundle_ref", in.profile.PostDeployValidationBundleRef, proto.BundlePostDeployValidation},
	} {
		if ref.ref == "" {
			continue
		}
		b, ok := snap.Bundle(ref.ref)
		if !ok {
			return fmt.Errorf("%s %s is not a published bundle", ref.field, ref.ref)
		}
		if b.Kind != ref.kind {
			return fmt.Errorf("%s %s is a %s bundle, not %s", ref.field, ref.ref, b.Kind, ref.kind)
		}
	}
	u, err := url.Parse(in.ud.CoordinatorURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("coordinator URL %q for nodes is not an absolute http(s) URL", in.ud.CoordinatorURL)
	}
	if len(in.rendered) > maxUserData {
		return fmt.Errorf("user-data is %d bytes, at most %d", len(in.rendered), maxUserData)
	}
	return nil
}

func (r *Runner) checkImage(ctx context.Context, mc *maas.Client, in predeployInput) (*HostImage, string, error) {
	if r.cfg.Images == nil {
		return nil, "no image catalog on this coordinator: the stock ubuntu/" + r.cfg.DistroSeries + " image", nil
	}
	img, ok, err := r.cfg.Images.ApprovedHostImage(in.site.Name, in.profile.Name)
	switch {
	case errors.Is(err, ErrNoHostImages):
		return nil, "the image catalog holds no host image: the stock ubuntu/" + r.cfg.DistroSeries + " image", nil
	case err != nil:
		return nil, "", fmt.Errorf("image catalog: %w", err)
	case !ok:
		return nil, "", fmt.Errorf("no host image is approved for %s/%s", in.site.Name, in.profile.Name)
	case img.Kind == ImageKindMAASDdgz:
		return nil, "", fmt.Errorf("host image %s %s is a ddgz full-disk image; the flat-storage deploy path needs a MAAS tgz root filesystem", img.Name, img.Version)
	case img.Kind != ImageKindMAASTgz:
		return nil, "", fmt.Errorf("host image %s %s has kind %q, not %s", img.Name, img.Version, img.Kind, ImageKindMAASTgz)
	}
	res, err := mc.BootResources(ctx)
	if err != nil {
		return nil, "", err
	}
	for _, br := range res {
		if (br.Name == img.Name || br.Name == "custom/"+img.Name) && slices.Contains(br.FileTypes, "root-tgz") {
			return &img, fmt.Sprintf("%s %s approved; MAAS boot resource %d (%s) is a root-tgz", img.Name, img.Version, br.ID, br.Name), nil
		}
	}
	return nil, "", fmt.Errorf("host image %s %s is approved but MAAS has no root-tgz boot resource named %s", img.Name, img.Version, img.Name)
}
