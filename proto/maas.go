package proto

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// MAAS sites and site profiles: where and how nodes are provisioned. A Site
// binds one MAAS region controller to a sales region and maps its profiles
// to pools (an onboarded node lands in its profile's pool); a SiteProfile
// is the policy of one kind of node at that site (the eleven fields of the
// MAAS capability matrix, the four it proposes, and a release mode).
//
// Raft commands continue the append-only enum after
// NodeCredentialRevokeType (26).
const (
	SiteUpsertType        MessageType = 28
	SiteProfileUpsertType MessageType = 29
)

func init() {
	messageTypeNames[SiteUpsertType] = "site_upsert"
	messageTypeNames[SiteProfileUpsertType] = "site_profile_upsert"
}

// WipePolicy is how the slice runtime erases a slot's raw NVMe disk.
type WipePolicy string

const (
	WipeBlkdiscard WipePolicy = "blkdiscard"
	WipeNVMeFormat WipePolicy = "nvme_format"
	WipeZero       WipePolicy = "zero"
)

// WipePolicies lists every wipe policy.
var WipePolicies = []WipePolicy{WipeBlkdiscard, WipeNVMeFormat, WipeZero}

// FabricMode is the fabric a profile's nodes use.
type FabricMode string

const (
	FabricEthernet FabricMode = "ethernet"
	FabricRoCE     FabricMode = "roce"
	FabricIB       FabricMode = "ib"
)

// FabricModes lists every fabric mode.
var FabricModes = []FabricMode{FabricEthernet, FabricRoCE, FabricIB}

// ReleaseMode is what decommissioning a node does to MAAS.
type ReleaseMode string

const (
	// ReleaseFullDecommission releases (erasing per policy) and powers off.
	ReleaseFullDecommission ReleaseMode = "full_decommission"
	// ReleaseReimage releases and deploys again.
	ReleaseReimage ReleaseMode = "reimage"
	// ReleaseDetachOnly forgets the node in GPUaaS; MAAS is not called.
	ReleaseDetachOnly ReleaseMode = "detach_only"
	// ReleaseCustomerHandoff never touches MAAS again after handoff.
	ReleaseCustomerHandoff ReleaseMode = "customer_handoff"
)

// ReleaseModes lists every release mode.
var ReleaseModes = []ReleaseMode{ReleaseFullDecommission, ReleaseReimage, ReleaseDetachOnly, ReleaseCustomerHandoff}

// StorageLayouts are the MAAS storage layouts a profile may name.
var StorageLayouts = []string{"flat", "lvm", "bcache", "blank"}

// AddressPool is a range of addresses in one subnet handed out by the
// ledger (RoCE interface addresses, IPoIB addresses).
type AddressPool struct {
	Subnet  string `json:"subnet"`            // CIDR, e.g. 10.50.0.0/16
	First   string `json:"first"`             // first assignable address
	Last    string `json:"last"`              // last assignable address
	MTU     int    `json:"mtu,omitempty"`     // 0: the fabric default
	Gateway string `json:"gateway,omitempty"` // optional, inside Subnet
}

// GuestSubnetPlan carves one guest (VM management) subnet per node out of
// a supernet: node i of the site gets the i-th /PrefixLen.
type GuestSubnetPlan struct {
	Supernet  string `json:"supernet"`   // CIDR
	PrefixLen int    `json:"prefix_len"` // per-node subnet size
}

// SealedSecret is a secret encrypted (AES-256-GCM) with a key every
// coordinator replica holds; the ledger, its log and its snapshots only
// ever see this form. KeyID names the key (a digest prefix, not the key).
type SealedSecret struct {
	KeyID      string `json:"key_id"`
	Nonce      []byte `json:"nonce"`
	Ciphertext []byte `json:"ciphertext"`
}

// Site is one MAAS installation serving a region.
type Site struct {
	Name   string `json:"name"`
	Region string `json:"region"`
	// Profiles maps each profile name of the site to the pool its nodes
	// join (the pool must be in the site's region).
	Profiles map[string]string `json:"profiles"`
	// MAASURL is the MAAS base URL, e.g. http://maas.example:5240/MAAS.
	MAASURL string `json:"maas_url"`
	// Credentials is the sealed MAAS API key (consumer:token:secret). The
	// API never returns it.
	Credentials *SealedSecret `json:"credentials,omitempty"`
	// PXEVLAN is the VLAN ID (1..4094) of the PXE/deploy network; 0 when
	// it is untagged.
	PXEVLAN    int      `json:"pxe_vlan"`
	PXESubnets []string `json:"pxe_subnets"`
	// CABundle is the PEM trust bundle nodes use to reach the coordinator
	// during bootstrap.
	CABundle        string           `json:"ca_bundle,omitempty"`
	RoCEPool        *AddressPool     `json:"roce_pool,omitempty"`
	IPoIBPool       *AddressPool     `json:"ipoib_pool,omitempty"`
	GuestSubnetPlan *GuestSubnetPlan `json:"guest_subnet_plan,omitempty"`
	WipePolicy      WipePolicy       `json:"wipe_policy"`
	// Ingress is the site's public addressing (nil: the site owns none and
	// public ingress is refused). It is set with PUT
	// /v1/sites/{name}/ingress; a site upsert keeps it.
	Ingress *SiteIngress `json:"ingress,omitempty"`
	Meta
}

// SiteProfile is the provisioning policy of one kind of node at a site.
type SiteProfile struct {
	Site string `json:"site"`
	Name string `json:"name"`
	// Intent is what the profile's nodes sell (MAAS tag
	// gpuaas-profile-slice-vm or gpuaas-profile-baremetal).
	Intent ProfileIntent `json:"intent"`

	// The eleven fields of the capability matrix.
	SiteBootstrapBundleRef               string   `json:"site_bootstrap_bundle_ref,omitempty"`
	StrictPXEPreflight                   bool     `json:"strict_pxe_preflight"`
	EnablePhase2RoCE                     bool     `json:"enable_phase2_roce"`
	RequireHWSync                        bool     `json:"require_hw_sync"`
	HardwareSyncInterval                 Duration `json:"hardware_sync_interval,omitempty"`
	ReleaseFallbackNoErase               bool     `json:"release_fallback_no_erase"`
	EnableDeployRetryOnDatasourceFailure bool     `json:"enable_deploy_retry_on_datasource_failure"`
	MaxDeployRetryAttempts               int      `json:"max_deploy_retry_attempts"`
	AutoClaimSingleNewMachine            bool     `json:"auto_claim_single_new_machine"`
	BatchMaxParallel                     int      `json:"batch_max_parallel"`
	EnrollmentTokenTTLSeconds            int      `json:"enrollment_token_ttl_seconds"`

	// The four it proposes.
	FabricMode                    FabricMode `json:"fabric_mode"`
	CommissioningBundleRef        string     `json:"commissioning_bundle_ref,omitempty"`
	PostDeployValidationBundleRef string     `json:"post_deploy_validation_bundle_ref,omitempty"`
	StorageLayoutProfile          string     `json:"storage_layout_profile,omitempty"`

	ReleaseMode ReleaseMode `json:"release_mode"`

	// TenantUserData is the site's cloud-init user-data for a baremetal
	// tenant deploy (a "#cloud-config" document or a "#!" script: login
	// policy, mounts, drivers). The handoff deploys it as one part of a
	// multipart document whose other part installs the tenant's SSH keys.
	TenantUserData string `json:"tenant_user_data,omitempty"`
	Meta
}

// MaxTenantUserData bounds a profile's tenant_user_data.
const MaxTenantUserData = 32 << 10

// Duration is a time.Duration that reads and writes JSON as a Go duration
// string ("15m").
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) {
	return []byte(`"` + time.Duration(d).String() + `"`), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return fmt.Errorf("duration %s: want a string such as \"15m\"", s)
	}
	v, err := time.ParseDuration(s[1 : len(s)-1])
	if err != nil {
		return fmt.Errorf("duration %s: %w", s, err)
	}
	*d = Duration(v)
	return nil
}

// SiteUpsertRequest creates or replaces a site. A nil Credentials on an
// existing site keeps the sealed key it has.
type SiteUpsertRequest struct {
	At   time.Time `json:"at"`
	Site Site      `json:"site"`
}

// SiteProfileUpsertRequest creates or replaces a site profile.
type SiteProfileUpsertRequest struct {
	At      time.Time   `json:"at"`
	Profile SiteProfile `json:"profile"`
}

// Bounds of the site and profile fields.
const (
	MaxPXESubnets               = 16
	MaxSiteProfiles             = 32
	MaxCABundleBytes            = 64 << 10
	MaxSealedSecretBytes        = 4096
	MaxDeployRetryAttemptsLimit = 10
	MaxBatchParallel            = 256
	MinEnrollmentTokenTTL       = 60
	MaxEnrollmentTokenTTL       = 7 * 24 * 3600
	MinHardwareSyncInterval     = Duration(time.Minute)
	MaxHardwareSyncInterval     = Duration(24 * time.Hour)
)

var bundleRefPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// ValidateBundleRef checks a content-addressed bundle reference
// ("sha256:<64 lowercase hex>"); empty is allowed (no bundle).
func ValidateBundleRef(what, ref string) error {
	if ref == "" || bundleRefPattern.MatchString(ref) {
		return nil
	}
	return Errorf(CodeInvalidArgument, "%s %q is not a bundle digest (sha256:<64 lowercase hex digits>)", what, truncate(ref, 80))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Validate checks every field of the pool; what names it in errors.
func (p *AddressPool) Validate(what string) error {
	pfx, err := netip.ParsePrefix(p.Subnet)
	if err != nil {
		return Errorf(CodeInvalidArgument, "%s subnet %q is not a CIDR prefix: %v", what, truncate(p.Subnet, 64), err)
	}
	if pfx != pfx.Masked() {
		return Errorf(CodeInvalidArgument, "%s subnet %s has host bits set (did you mean %s?)", what, p.Subnet, pfx.Masked())
	}
	addr := func(field, v string) (netip.Addr, error) {
		a, err := netip.ParseAddr(v)
		if err != nil {
			return a, Errorf(CodeInvalidArgument, "%s %s %q is not an IP address", what, field, truncate(v, 64))
		}
		if !pfx.Contains(a) {
			return a, Errorf(CodeInvalidArgument, "%s %s %s is outside subnet %s", what, field, a, pfx)
		}
		return a, nil
	}
	first, err := addr("first", p.First)
	if err != nil {
		return err
	}
	last, err := addr("last", p.Last)
	if err != nil {
		return err
	}
	if last.Less(first) {
		return Errorf(CodeInvalidArgument, "%s range %s-%s is empty (last before first)", what, first, last)
	}
	if p.Gateway != "" {
		gw, err := addr("gateway", p.Gateway)
		if err != nil {
			return err
		}
		if !gw.Less(first) && !last.Less(gw) {
			return Errorf(CodeInvalidArgument, "%s gateway %s is inside the assignable range %s-%s", what, gw, first, last)
		}
	}
	if p.MTU != 0 && (p.MTU < 1280 || p.MTU > 9216) {
		return Errorf(CodeInvalidArgument, "%s mtu %d is outside 1280..9216", what, p.MTU)
	}
	return nil
}

// Validate checks the plan.
func (g *GuestSubnetPlan) Validate() error {
	pfx, err := netip.ParsePrefix(g.Supernet)
	if err != nil {
		return Errorf(CodeInvalidArgument, "guest_subnet_plan supernet %q is not a CIDR prefix: %v", truncate(g.Supernet, 64), err)
	}
	if pfx != pfx.Masked() {
		return Errorf(CodeInvalidArgument, "guest_subnet_plan supernet %s has host bits set (did you mean %s?)", g.Supernet, pfx.Masked())
	}
	if !pfx.Addr().Is4() {
		return Errorf(CodeInvalidArgument, "guest_subnet_plan supernet %s is not IPv4", pfx)
	}
	if g.PrefixLen <= pfx.Bits() || g.PrefixLen > 29 {
		return Errorf(CodeInvalidArgument, "guest_subnet_plan prefix_len %d must be longer than the supernet's /%d and at most /29", g.PrefixLen, pfx.Bits())
	}
	return nil
}

// NodeSubnet returns the guest subnet of node number i (0-based).
func (g *GuestSubnetPlan) NodeSubnet(i int) (netip.Prefix, error) {
	pfx, err := netip.ParsePrefix(g.Supernet)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("guest subnet plan: %w", err)
	}
	n := 1 << (g.PrefixLen - pfx.Bits())
	if i < 0 || i >= n {
		return netip.Prefix{}, fmt.Errorf("guest subnet plan %s/%d: node number %d outside 0..%d", pfx, g.PrefixLen, i, n-1)
	}
	b := pfx.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(i) << (32 - g.PrefixLen)
	a := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	return netip.PrefixFrom(a, g.PrefixLen), nil
}

// Validate checks the sealed secret's shape (not its content: only a
// replica holding the key can open it).
func (s *SealedSecret) Validate(what string) error {
	switch {
	case s.KeyID == "" || len(s.KeyID) > 64:
		return Errorf(CodeInvalidArgument, "%s: key_id must be 1..64 characters", what)
	case len(s.Nonce) != 12:
		return Errorf(CodeInvalidArgument, "%s: nonce is %d bytes, want 12", what, len(s.Nonce))
	case len(s.Ciphertext) < 17 || len(s.Ciphertext) > MaxSealedSecretBytes:
		return Errorf(CodeInvalidArgument, "%s: ciphertext is %d bytes, want 17..%d", what, len(s.Ciphertext), MaxSealedSecretBytes)
	}
	return nil
}

// Validate checks every field of the site on its own (the FSM checks the
// references: region, pools).
func (s *Site) Validate() error {
	if err := ValidateID("site name", s.Name); err != nil {
		return err
	}
	if err := ValidateID("site region", s.Region); err != nil {
		return err
	}
	if len(s.Profiles) == 0 {
		return Errorf(CodeInvalidArgument, "site %s: profiles must map at least one profile to a pool", s.Name)
	}
	if len(s.Profiles) > MaxSiteProfiles {
		return Errorf(CodeInvalidArgument, "site %s: %d profiles, at most %d", s.Name, len(s.Profiles), MaxSiteProfiles)
	}
	for _, name := range sortedKeys(s.Profiles) {
		if err := ValidateID("site profile name", name); err != nil {
			return err
		}
		if err := ValidateID("pool of profile "+name, s.Profiles[name]); err != nil {
			return err
		}
	}
	if err := validateMAASURL(s.MAASURL); err != nil {
		return Errorf(CodeInvalidArgument, "site %s: %v", s.Name, err)
	}
	if s.Credentials != nil {
		if err := s.Credentials.Validate("site " + s.Name + " credentials"); err != nil {
			return err
		}
	}
	if s.PXEVLAN < 0 || s.PXEVLAN > 4094 {
		return Errorf(CodeInvalidArgument, "site %s: pxe_vlan %d is outside 0..4094 (0: untagged)", s.Name, s.PXEVLAN)
	}
	if len(s.PXESubnets) == 0 {
		return Errorf(CodeInvalidArgument, "site %s: pxe_subnets needs at least one CIDR", s.Name)
	}
	if len(s.PXESubnets) > MaxPXESubnets {
		return Errorf(CodeInvalidArgument, "site %s: %d pxe_subnets, at most %d", s.Name, len(s.PXESubnets), MaxPXESubnets)
	}
	var pxe []netip.Prefix
	for _, c := range s.PXESubnets {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return Errorf(CodeInvalidArgument, "site %s: pxe subnet %q is not a CIDR prefix: %v", s.Name, truncate(c, 64), err)
		}
		if p != p.Masked() {
			return Errorf(CodeInvalidArgument, "site %s: pxe subnet %s has host bits set (did you mean %s?)", s.Name, c, p.Masked())
		}
		for _, q := range pxe {
			if q.Overlaps(p) {
				return Errorf(CodeInvalidArgument, "site %s: pxe subnets %s and %s overlap", s.Name, q, p)
			}
		}
		pxe = append(pxe, p)
	}
	if s.CABundle != "" {
		if err := validateCABundle(s.CABundle); err != nil {
			return Errorf(CodeInvalidArgument, "site %s: ca_bundle: %v", s.Name, err)
		}
	}
	if s.RoCEPool != nil {
		if err := s.RoCEPool.Validate("site " + s.Name + " roce_pool"); err != nil {
			return err
		}
	}
	if s.IPoIBPool != nil {
		if err := s.IPoIBPool.Validate("site " + s.Name + " ipoib_pool"); err != nil {
			return err
		}
	}
	if s.RoCEPool != nil && s.IPoIBPool != nil {
		a, _ := netip.ParsePrefix(s.RoCEPool.Subnet)
		b, _ := netip.ParsePrefix(s.IPoIBPool.Subnet)
		if a.Overlaps(b) {
			return Errorf(CodeInvalidArgument, "site %s: roce_pool subnet %s overlaps ipoib_pool subnet %s", s.Name, a, b)
		}
	}
	if s.GuestSubnetPlan != nil {
		if err := s.GuestSubnetPlan.Validate(); err != nil {
			return Errorf(CodeInvalidArgument, "site %s: %v", s.Name, err.(*Error).Detail)
		}
	}
	if s.Ingress != nil {
		if err := s.Ingress.Validate(s.Name); err != nil {
			return err
		}
	}
	if !slices.Contains(WipePolicies, s.WipePolicy) {
		return Errorf(CodeInvalidArgument, "site %s: wipe_policy %q is not one of blkdiscard, nvme_format, zero", s.Name, truncate(string(s.WipePolicy), 32))
	}
	return nil
}

func validateMAASURL(raw string) error {
	if raw == "" {
		return fmt.Errorf("maas_url is required")
	}
	if len(raw) > 512 {
		return fmt.Errorf("maas_url is %d characters long; at most 512", len(raw))
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("maas_url %q: %v", truncate(raw, 64), err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("maas_url %q: scheme must be http or https", truncate(raw, 64))
	}
	if u.Host == "" {
		return fmt.Errorf("maas_url %q has no host", truncate(raw, 64))
	}
	if u.User != nil {
		return fmt.Errorf("maas_url must not carry user information (credentials go in maas_api_key)")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("maas_url %q must not have a query or fragment", truncate(raw, 64))
	}
	return nil
}

func validateCABundle(b string) error {
	if len(b) > MaxCABundleBytes {
		return fmt.Errorf("%d bytes, at most %d", len(b), MaxCABundleBytes)
	}
	if strings.Contains(b, "{{") || strings.Contains(b, "REPLACE") {
		return fmt.Errorf("looks like an unrendered template placeholder")
	}
	rest := []byte(b)
	n := 0
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return fmt.Errorf("PEM block %d is %q, want CERTIFICATE", n+1, blk.Type)
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return fmt.Errorf("certificate %d: %v", n+1, err)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("no PEM certificate found")
	}
	if strings.TrimSpace(string(rest)) != "" {
		return fmt.Errorf("trailing data after certificate %d", n)
	}
	return nil
}

// Validate checks every field of the profile on its own and their mutual
// consistency (the FSM checks it against its site).
func (p *SiteProfile) Validate() error {
	if err := ValidateID("profile site", p.Site); err != nil {
		return err
	}
	if err := ValidateID("profile name", p.Name); err != nil {
		return err
	}
	name := p.Site + "/" + p.Name
	bad := func(format string, args ...any) error {
		return Errorf(CodeInvalidArgument, "profile %s: "+format, append([]any{name}, args...)...)
	}
	if !p.Intent.Valid() {
		return bad("intent %q is not one of slice_vm, baremetal", truncate(string(p.Intent), 32))
	}
	for _, r := range []struct{ field, v string }{
		{"site_bootstrap_bundle_ref", p.SiteBootstrapBundleRef},
		{"commissioning_bundle_ref", p.CommissioningBundleRef},
		{"post_deploy_validation_bundle_ref", p.PostDeployValidationBundleRef},
	} {
		if err := ValidateBundleRef(r.field, r.v); err != nil {
			return bad("%s", err.(*Error).Detail)
		}
	}
	if p.RequireHWSync && p.HardwareSyncInterval == 0 {
		return bad("require_hw_sync needs hardware_sync_interval (how old a MAAS hardware sync may be)")
	}
	if p.HardwareSyncInterval != 0 && (p.HardwareSyncInterval < MinHardwareSyncInterval || p.HardwareSyncInterval > MaxHardwareSyncInterval) {
		return bad("hardware_sync_interval %s is outside %s..%s", time.Duration(p.HardwareSyncInterval), time.Duration(MinHardwareSyncInterval), time.Duration(MaxHardwareSyncInterval))
	}
	if p.MaxDeployRetryAttempts < 0 || p.MaxDeployRetryAttempts > MaxDeployRetryAttemptsLimit {
		return bad("max_deploy_retry_attempts %d is outside 0..%d", p.MaxDeployRetryAttempts, MaxDeployRetryAttemptsLimit)
	}
	if p.EnableDeployRetryOnDatasourceFailure && p.MaxDeployRetryAttempts == 0 {
		return bad("enable_deploy_retry_on_datasource_failure needs max_deploy_retry_attempts of at least 1")
	}
	if !p.EnableDeployRetryOnDatasourceFailure && p.MaxDeployRetryAttempts != 0 {
		return bad("max_deploy_retry_attempts %d is set but enable_deploy_retry_on_datasource_failure is false", p.MaxDeployRetryAttempts)
	}
	if p.BatchMaxParallel < 1 || p.BatchMaxParallel > MaxBatchParallel {
		return bad("batch_max_parallel %d is outside 1..%d", p.BatchMaxParallel, MaxBatchParallel)
	}
	if p.EnrollmentTokenTTLSeconds < MinEnrollmentTokenTTL || p.EnrollmentTokenTTLSeconds > MaxEnrollmentTokenTTL {
		return bad("enrollment_token_ttl_seconds %d is outside %d..%d", p.EnrollmentTokenTTLSeconds, MinEnrollmentTokenTTL, MaxEnrollmentTokenTTL)
	}
	if !slices.Contains(FabricModes, p.FabricMode) {
		return bad("fabric_mode %q is not one of ethernet, roce, ib", truncate(string(p.FabricMode), 32))
	}
	if p.EnablePhase2RoCE && p.FabricMode != FabricRoCE {
		return bad("enable_phase2_roce needs fabric_mode roce, not %s", p.FabricMode)
	}
	if p.StorageLayoutProfile != "" && !slices.Contains(StorageLayouts, p.StorageLayoutProfile) {
		return bad("storage_layout_profile %q is not one of %s", truncate(p.StorageLayoutProfile, 32), strings.Join(StorageLayouts, ", "))
	}
	if !slices.Contains(ReleaseModes, p.ReleaseMode) {
		return bad("release_mode %q is not one of full_decommission, reimage, detach_only, customer_handoff", truncate(string(p.ReleaseMode), 32))
	}
	if u := p.TenantUserData; u != "" {
		switch {
		case len(u) > MaxTenantUserData:
			return bad("tenant_user_data is %d bytes; at most %d are allowed", len(u), MaxTenantUserData)
		case !utf8.ValidString(u):
			return bad("tenant_user_data is not UTF-8 text")
		case !strings.HasPrefix(u, "#cloud-config\n") && !strings.HasPrefix(u, "#!"):
			return bad("tenant_user_data must start with a \"#cloud-config\" line or a \"#!\" script line")
		case p.Intent != IntentBaremetal:
			return bad("tenant_user_data is for baremetal profiles; this one has intent %s", p.Intent)
		}
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// SiteBody is the body of PUT /v1/sites/{name}: the site's fields plus the
// MAAS API key in clear ("consumer:token:secret"), which the coordinator
// seals before proposing it. An update without maas_api_key keeps the
// stored key. Name and credentials come from the path and the coordinator.
type SiteBody struct {
	Site
	MAASAPIKey string `json:"maas_api_key,omitempty"`
}

// SiteView is a site as the API returns it: never the credentials, only
// whether a key is stored and which site key sealed it.
type SiteView struct {
	Site
	CredentialsSet   bool   `json:"credentials_set"`
	CredentialsKeyID string `json:"credentials_key_id,omitempty"`
}

// ViewOf returns the API view of s (credentials removed).
func ViewOf(s *Site) SiteView {
	v := SiteView{Site: *s}
	if s.Credentials != nil {
		v.CredentialsSet = true
		v.CredentialsKeyID = s.Credentials.KeyID
	}
	v.Credentials = nil
	return v
}

var maasKeyPart = regexp.MustCompile(`^[A-Za-z0-9._~+/=-]{1,200}$`)

// ValidateMAASAPIKey checks the shape of a MAAS API key
// ("consumer:token:secret") without echoing it in the error.
func ValidateMAASAPIKey(key string) error {
	parts := strings.Split(key, ":")
	if len(parts) != 3 {
		return Errorf(CodeInvalidArgument, "maas_api_key must have the form consumer:token:secret (got %d colon-separated parts)", len(parts))
	}
	for i, p := range parts {
		if !maasKeyPart.MatchString(p) {
			return Errorf(CodeInvalidArgument, "maas_api_key part %d (of consumer:token:secret) is empty or has characters outside [A-Za-z0-9._~+/=-]", i+1)
		}
	}
	return nil
}
