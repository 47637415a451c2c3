package proto_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

func TestSiteValidate(t *testing.T) {
	t.Parallel()
	sealed := &proto.SealedSecret{KeyID: "k1", Nonce: make([]byte, 12), Ciphertext: make([]byte, 40)}
	tests := []struct {
		name   string
		change func(*proto.Site)
		want   string // "" = valid
	}{
		{"fixture", func(*proto.Site) {}, ""},
		{"with credentials", func(s *proto.Site) { s.Credentials = sealed }, ""},
		{"minimal", func(s *proto.Site) { s.CABundle, s.RoCEPool, s.IPoIBPool, s.GuestSubnetPlan = "", nil, nil, nil }, ""},
		{"name missing", func(s *proto.Site) { s.Name = "" }, "site name is required"},
		{"name bad", func(s *proto.Site) { s.Name = "Site A" }, "site name \"Site A\" is not a valid identifier"},
		{"region missing", func(s *proto.Site) { s.Region = "" }, "site region is required"},
		{"no profiles", func(s *proto.Site) { s.Profiles = nil }, "profiles must map at least one profile"},
		{"profile name bad", func(s *proto.Site) { s.Profiles = map[string]string{"../x": "p"} }, "site profile name \"../x\""},
		{"profile pool empty", func(s *proto.Site) { s.Profiles = map[string]string{"x": ""} }, "pool of profile x is required"},
		{"maas url missing", func(s *proto.Site) { s.MAASURL = "" }, "maas_url is required"},
		{"maas url scheme", func(s *proto.Site) { s.MAASURL = "ftp://maas/MAAS" }, "scheme must be http or https"},
		{"maas url no host", func(s *proto.Site) { s.MAASURL = "http:///MAAS" }, "has no host"},
		{"maas url userinfo", func(s *proto.Site) { s.MAASURL = "http://a:b@maas/MAAS" }, "must not carry user information"},
		{"maas url query", func(s *proto.Site) { s.MAASURL = "http://maas/MAAS?x=1" }, "must not have a query"},
		{"credentials nonce", func(s *proto.Site) {
			s.Credentials = &proto.SealedSecret{KeyID: "k", Nonce: []byte{1}, Ciphertext: make([]byte, 40)}
		}, "nonce is 1 bytes, want 12"},
		{"credentials key id", func(s *proto.Site) {
			s.Credentials = &proto.SealedSecret{Nonce: make([]byte, 12), Ciphertext: make([]byte, 40)}
		}, "key_id must be 1..64"},
		{"credentials short", func(s *proto.Site) {
			s.Credentials = &proto.SealedSecret{KeyID: "k", Nonce: make([]byte, 12), Ciphertext: make([]byte, 16)}
		}, "ciphertext is 16 bytes"},
		{"pxe vlan negative", func(s *proto.Site) { s.PXEVLAN = -1 }, "pxe_vlan -1 is outside 0..4094"},
		{"pxe vlan too big", func(s *proto.Site) { s.PXEVLAN = 4095 }, "pxe_vlan 4095 is outside"},
		{"pxe vlan tagged", func(s *proto.Site) { s.PXEVLAN = 100 }, ""},
		{"pxe subnets empty", func(s *proto.Site) { s.PXESubnets = nil }, "pxe_subnets needs at least one CIDR"},
		{"pxe subnet bad", func(s *proto.Site) { s.PXESubnets = []string{"10.0.0.0"} }, "pxe subnet \"10.0.0.0\" is not a CIDR prefix"},
		{"pxe subnet host bits", func(s *proto.Site) { s.PXESubnets = []string{"10.0.0.1/24"} }, "has host bits set (did you mean 10.0.0.0/24?)"},
		{"pxe subnets overlap", func(s *proto.Site) { s.PXESubnets = []string{"10.0.0.0/16", "10.0.1.0/24"} }, "overlap"},
		{"ca bundle garbage", func(s *proto.Site) { s.CABundle = "hello" }, "ca_bundle: no PEM certificate found"},
		{"ca bundle template", func(s *proto.Site) { s.CABundle = "{{ .CA }}" }, "unrendered template placeholder"},
		{"ca bundle key", func(s *proto.Site) {
			s.CABundle = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
		}, "is \"PRIVATE KEY\", want CERTIFICATE"},
		{"ca bundle bad der", func(s *proto.Site) {
			s.CABundle = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
		}, "certificate 1:"},
		{"ca bundle trailing", func(s *proto.Site) { s.CABundle = prototest.TestCA + "junk" }, "trailing data"},
		{"ca bundle two", func(s *proto.Site) { s.CABundle = prototest.TestCA + prototest.TestCA }, ""},
		{"roce subnet bad", func(s *proto.Site) { s.RoCEPool.Subnet = "x" }, "roce_pool subnet \"x\" is not a CIDR"},
		{"roce first outside", func(s *proto.Site) { s.RoCEPool.First = "10.51.0.1" }, "roce_pool first 10.51.0.1 is outside subnet"},
		{"roce last bad", func(s *proto.Site) { s.RoCEPool.Last = "nope" }, "roce_pool last \"nope\" is not an IP"},
		{"roce empty range", func(s *proto.Site) { s.RoCEPool.First, s.RoCEPool.Last = "10.50.0.20", "10.50.0.10" }, "is empty (last before first)"},
		{"roce gateway in range", func(s *proto.Site) { s.RoCEPool.Gateway = "10.50.0.20" }, "gateway 10.50.0.20 is inside the assignable range"},
		{"roce gateway ok", func(s *proto.Site) { s.RoCEPool.Gateway = "10.50.0.1" }, ""},
		{"roce mtu", func(s *proto.Site) { s.RoCEPool.MTU = 100 }, "mtu 100 is outside 1280..9216"},
		{"ipoib first bad", func(s *proto.Site) { s.IPoIBPool.First = "" }, "ipoib_pool first \"\" is not an IP"},
		{"pools overlap", func(s *proto.Site) {
			s.IPoIBPool = &proto.AddressPool{Subnet: "10.50.4.0/24", First: "10.50.4.1", Last: "10.50.4.9"}
		}, "overlaps ipoib_pool"},
		{"guest plan supernet", func(s *proto.Site) { s.GuestSubnetPlan.Supernet = "bad" }, "guest_subnet_plan supernet \"bad\""},
		{"guest plan v6", func(s *proto.Site) { s.GuestSubnetPlan.Supernet = "fd00::/48" }, "is not IPv4"},
		{"guest plan prefix short", func(s *proto.Site) { s.GuestSubnetPlan.PrefixLen = 12 }, "prefix_len 12 must be longer"},
		{"guest plan prefix long", func(s *proto.Site) { s.GuestSubnetPlan.PrefixLen = 30 }, "at most /29"},
		{"wipe policy missing", func(s *proto.Site) { s.WipePolicy = "" }, "wipe_policy \"\" is not one of blkdiscard, nvme_format, zero"},
		{"wipe policy nvme", func(s *proto.Site) { s.WipePolicy = proto.WipeNVMeFormat }, ""},
		{"wipe policy zero", func(s *proto.Site) { s.WipePolicy = proto.WipeZero }, ""},
		{"wipe policy bad", func(s *proto.Site) { s.WipePolicy = "shred" }, "wipe_policy \"shred\""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := prototest.Site()
			tc.change(&s)
			err := s.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, proto.CodeInvalidArgument, proto.CodeOf(err))
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestSiteProfileValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(*proto.SiteProfile)
		want   string
	}{
		{"fixture", func(*proto.SiteProfile) {}, ""},
		{"site missing", func(p *proto.SiteProfile) { p.Site = "" }, "profile site is required"},
		{"name bad", func(p *proto.SiteProfile) { p.Name = "A/B" }, "profile name \"A/B\""},
		{"intent bad", func(p *proto.SiteProfile) { p.Intent = "vm" }, "intent \"vm\" is not one of slice_vm, baremetal"},
		{"intent baremetal", func(p *proto.SiteProfile) { p.Intent = proto.IntentBaremetal }, ""},
		{"site bootstrap ref bad", func(p *proto.SiteProfile) { p.SiteBootstrapBundleRef = "sha256:abc" }, "site_bootstrap_bundle_ref \"sha256:abc\" is not a bundle digest"},
		{"site bootstrap ref upper", func(p *proto.SiteProfile) { p.SiteBootstrapBundleRef = "sha256:" + strings.Repeat("AB", 32) }, "is not a bundle digest"},
		{"site bootstrap ref empty", func(p *proto.SiteProfile) { p.SiteBootstrapBundleRef = "" }, ""},
		{"strict pxe off", func(p *proto.SiteProfile) { p.StrictPXEPreflight = false }, ""},
		{"phase2 roce without roce", func(p *proto.SiteProfile) { p.FabricMode = proto.FabricEthernet }, "enable_phase2_roce needs fabric_mode roce, not ethernet"},
		{"phase2 roce off ethernet", func(p *proto.SiteProfile) { p.EnablePhase2RoCE, p.FabricMode = false, proto.FabricEthernet }, ""},
		{"hw sync without interval", func(p *proto.SiteProfile) { p.HardwareSyncInterval = 0 }, "require_hw_sync needs hardware_sync_interval"},
		{"hw sync off no interval", func(p *proto.SiteProfile) { p.RequireHWSync, p.HardwareSyncInterval = false, 0 }, ""},
		{"hw sync interval short", func(p *proto.SiteProfile) { p.HardwareSyncInterval = proto.Duration(time.Second) }, "hardware_sync_interval 1s is outside 1m0s..24h0m0s"},
		{"hw sync interval long", func(p *proto.SiteProfile) { p.HardwareSyncInterval = proto.Duration(48 * time.Hour) }, "outside"},
		{"fallback no erase", func(p *proto.SiteProfile) { p.ReleaseFallbackNoErase = true }, ""},
		{"retry without attempts", func(p *proto.SiteProfile) { p.MaxDeployRetryAttempts = 0 }, "needs max_deploy_retry_attempts of at least 1"},
		{"attempts without retry", func(p *proto.SiteProfile) { p.EnableDeployRetryOnDatasourceFailure = false }, "max_deploy_retry_attempts 2 is set but enable_deploy_retry_on_datasource_failure is false"},
		{"retry off", func(p *proto.SiteProfile) {
			p.EnableDeployRetryOnDatasourceFailure, p.MaxDeployRetryAttempts = false, 0
		}, ""},
		{"attempts too many", func(p *proto.SiteProfile) { p.MaxDeployRetryAttempts = 11 }, "max_deploy_retry_attempts 11 is outside 0..10"},
		{"attempts negative", func(p *proto.SiteProfile) { p.MaxDeployRetryAttempts = -1 }, "outside 0..10"},
		{"auto claim", func(p *proto.SiteProfile) { p.AutoClaimSingleNewMachine = true }, ""},
		{"batch zero", func(p *proto.SiteProfile) { p.BatchMaxParallel = 0 }, "batch_max_parallel 0 is outside 1..256"},
		{"batch too big", func(p *proto.SiteProfile) { p.BatchMaxParallel = 257 }, "outside 1..256"},
		{"ttl short", func(p *proto.SiteProfile) { p.EnrollmentTokenTTLSeconds = 59 }, "enrollment_token_ttl_seconds 59 is outside 60..604800"},
		{"ttl long", func(p *proto.SiteProfile) { p.EnrollmentTokenTTLSeconds = 604801 }, "outside 60..604800"},
		{"fabric missing", func(p *proto.SiteProfile) { p.EnablePhase2RoCE, p.FabricMode = false, "" }, "fabric_mode \"\" is not one of ethernet, roce, ib"},
		{"fabric ib", func(p *proto.SiteProfile) { p.EnablePhase2RoCE, p.FabricMode = false, proto.FabricIB }, ""},
		{"commissioning ref bad", func(p *proto.SiteProfile) { p.CommissioningBundleRef = "latest" }, "commissioning_bundle_ref \"latest\""},
		{"commissioning ref ok", func(p *proto.SiteProfile) { p.CommissioningBundleRef = "sha256:" + strings.Repeat("0", 64) }, ""},
		{"validation ref bad", func(p *proto.SiteProfile) { p.PostDeployValidationBundleRef = "md5:x" }, "post_deploy_validation_bundle_ref \"md5:x\""},
		{"storage layout bad", func(p *proto.SiteProfile) { p.StorageLayoutProfile = "zfs" }, "storage_layout_profile \"zfs\" is not one of flat, lvm, bcache, blank"},
		{"storage layout lvm", func(p *proto.SiteProfile) { p.StorageLayoutProfile = "lvm" }, ""},
		{"release mode missing", func(p *proto.SiteProfile) { p.ReleaseMode = "" }, "release_mode \"\" is not one of"},
		{"release mode handoff", func(p *proto.SiteProfile) { p.ReleaseMode = proto.ReleaseCustomerHandoff }, ""},
		{"release mode reimage", func(p *proto.SiteProfile) { p.ReleaseMode = proto.ReleaseReimage }, ""},
		{"release mode detach", func(p *proto.SiteProfile) { p.ReleaseMode = proto.ReleaseDetachOnly }, ""},
		{"tenant user-data", func(p *proto.SiteProfile) {
			p.Intent, p.TenantUserData = proto.IntentBaremetal, "#cloud-config\npackages: [htop]\n"
		}, ""},
		{"tenant user-data script", func(p *proto.SiteProfile) { p.Intent, p.TenantUserData = proto.IntentBaremetal, "#!/bin/sh\necho hi\n" }, ""},
		{"tenant user-data no header", func(p *proto.SiteProfile) { p.Intent, p.TenantUserData = proto.IntentBaremetal, "packages: [htop]\n" },
			"tenant_user_data must start with a \"#cloud-config\" line"},
		{"tenant user-data slice", func(p *proto.SiteProfile) { p.TenantUserData = "#cloud-config\n" }, "tenant_user_data is for baremetal profiles"},
		{"tenant user-data large", func(p *proto.SiteProfile) {
			p.Intent, p.TenantUserData = proto.IntentBaremetal, "#!/bin/sh\n"+strings.Repeat("#", proto.MaxTenantUserData)
		}, "at most 32768"},
		{"tenant user-data binary", func(p *proto.SiteProfile) { p.Intent, p.TenantUserData = proto.IntentBaremetal, "#!/bin/sh\n\xff" },
			"not UTF-8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := prototest.SiteProfile()
			tc.change(&p)
			err := p.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, proto.CodeInvalidArgument, proto.CodeOf(err))
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "profile ")
		})
	}
}

func TestSiteProfileJSONRoundTrip(t *testing.T) {
	t.Parallel()
	p := prototest.SiteProfile()
	b, err := json.Marshal(p)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"hardware_sync_interval":"15m0s"`)
	var back proto.SiteProfile
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, p, back)
	require.Error(t, json.Unmarshal([]byte(`{"hardware_sync_interval":900}`), &back))
	require.Error(t, json.Unmarshal([]byte(`{"hardware_sync_interval":"soon"}`), &back))
}

func TestGuestSubnetPlanNodeSubnet(t *testing.T) {
	t.Parallel()
	g := proto.GuestSubnetPlan{Supernet: "172.16.0.0/12", PrefixLen: 24}
	for i, want := range map[int]string{0: "172.16.0.0/24", 1: "172.16.1.0/24", 256: "172.17.0.0/24", 4095: "172.31.255.0/24"} {
		p, err := g.NodeSubnet(i)
		require.NoError(t, err)
		assert.Equal(t, want, p.String())
	}
	_, err := g.NodeSubnet(4096)
	require.ErrorContains(t, err, "node number 4096 outside 0..4095")
	_, err = g.NodeSubnet(-1)
	require.Error(t, err)
}

func TestMAASCommandNames(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "site_upsert", proto.SiteUpsertType.String())
	assert.Equal(t, "site_profile_upsert", proto.SiteProfileUpsertType.String())
}

func TestViewOfWorkflowTimeline(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	w := &proto.MAASWorkflow{ID: "onboard.s.h", Buckets: []proto.BucketSpan{
		{Bucket: proto.BucketDiscovery, Start: t0, End: t0.Add(2 * time.Second)},
		{Bucket: proto.BucketCommission, Start: t0.Add(2 * time.Second), End: t0.Add(8 * time.Minute)},
		{Bucket: proto.BucketImageDeploy, Start: t0.Add(10 * time.Minute)},
	}}
	v := proto.ViewOfWorkflow(w, t0.Add(15*time.Minute))
	require.Len(t, v.Timeline, 12)
	assert.Equal(t, proto.BucketRequestToStart, v.Timeline[0].Bucket)
	assert.False(t, v.Timeline[0].Measured)
	assert.Equal(t, 2.0, v.Timeline[1].DurationSeconds)
	assert.Equal(t, 478.0, v.Timeline[2].DurationSeconds)
	assert.True(t, v.Timeline[4].Open)
	assert.Equal(t, 300.0, v.Timeline[4].DurationSeconds, "an open bucket runs to now")
	assert.Equal(t, 480.0, v.TotalSeconds, "only closed buckets count")
}

func TestHandoffWorkflowValidate(t *testing.T) {
	t.Parallel()
	valid := func(k proto.WorkflowKind) proto.MAASWorkflow {
		return proto.MAASWorkflow{ID: proto.HandoffWorkflowID(k, "task-1"), Kind: k, Site: "s", Profile: "bm", Hostname: "h",
			Stage: proto.StagesOf(k)[0], State: proto.WorkflowRunning, AllocationID: "alloc-1", TaskID: "task-1",
			SSHPublicKeys: []string{"ssh-ed25519 AAAA k"}}
	}
	tests := []struct {
		name   string
		kind   proto.WorkflowKind
		change func(*proto.MAASWorkflow)
		want   string
	}{
		{"handoff", proto.WorkflowHandoff, func(*proto.MAASWorkflow) {}, ""},
		{"reclaim", proto.WorkflowReclaim, func(w *proto.MAASWorkflow) { w.SSHPublicKeys = nil }, ""},
		{"handoff deploy stage", proto.WorkflowHandoff, func(w *proto.MAASWorkflow) { w.Stage = proto.StageDeploy }, ""},
		{"reclaim has no deploy", proto.WorkflowReclaim, func(w *proto.MAASWorkflow) { w.Stage = proto.StageDeploy }, "is not a stage of reclaim"},
		{"no allocation", proto.WorkflowHandoff, func(w *proto.MAASWorkflow) { w.AllocationID = "" }, "workflow allocation_id is required"},
		{"no task", proto.WorkflowReclaim, func(w *proto.MAASWorkflow) { w.TaskID = "" }, "workflow task_id is required"},
		{"key with newline", proto.WorkflowHandoff, func(w *proto.MAASWorkflow) { w.SSHPublicKeys = []string{"ssh-ed25519 A\nruncmd"} },
			"not one printable line"},
		{"bad access", proto.WorkflowHandoff, func(w *proto.MAASWorkflow) { w.Access = &proto.SliceAccess{GuestIP: "x"} }, "access"},
		{"unknown kind", "adopt", func(*proto.MAASWorkflow) {}, "is not onboard, decommission, handoff or reclaim"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := tc.kind
			if k == "adopt" {
				k = proto.WorkflowHandoff
			}
			w := valid(k)
			w.Kind = tc.kind
			tc.change(&w)
			err := w.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestAllocationSSHKeyIsOneLine(t *testing.T) {
	t.Parallel()
	r := proto.AllocationCreateRequest{CapacityShape: proto.ShapeBaremetal, SKU: "h200-sxm-baremetal", Region: "r1",
		SSHPublicKeys: []string{"ssh-ed25519 AAAA k\nruncmd: [reboot]"}}
	err := r.Validate(proto.DefaultSKUs())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ssh_public_keys[0] is not one line of printable text")
}
