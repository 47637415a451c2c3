// Package prototest holds fixture constructors of proto objects for tests
// of every package: each returns a fresh, valid object that a test changes
// one field of.
package prototest

import (
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// TestCA is a self-signed P-256 CA certificate (PEM) valid for a century.
const TestCA = `-----BEGIN CERTIFICATE-----
MIIBiTCCAS+gAwIBAgIUB+MOus7QoLelLW1R8R22POZJ2AQwCgYIKoZIzj0EAwIw
GTEXMBUGA1UEAwwOZ3B1YWFzLXRlc3QtY2EwIBcNMjYxMTIxMjAyMDQ3WhgPMjEy
NjEwMjgyMDIwNDdaMBkxFzAVBgNVBAMMDmdwdWFhcy10ZXN0LWNhMFkwEwYHKoZI
zj0CAQYIKoZIzj0DAQcDQgAE8A/56Iq5eWRugUo4MpsE5Xj/fzlIjWEBPgUtWcAS
UoCsHYcemcnrnZ5NAQOiaj/fmcyEvkVux5FB46Fgl1MogaNTMFEwHQYDVR0OBBYE
FMnH/R3JqA60ok5QqYS4u0hvTyFzMB8GA1UdIwQYMBaAFMnH/R3JqA60ok5QqYS4
u0hvTyFzMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIhAI6oIPlw
nDaIXx8iu0ItZX65XLVbYwZQfyleZTu9FxeHAiBjMaBTLCWY5rQazK/+OhmrIePt
J6uycWvvESLAw6AauA==
-----END CERTIFICATE-----
`

// Site returns a valid site "site-a" in region "r1" mapping profile
// "slice" to pool "pool-slice" and "bm" to "pool-bm", without credentials.
func Site() proto.Site {
	return proto.Site{
		Name:            "site-a",
		Region:          "r1",
		Profiles:        map[string]string{"slice": "pool-slice", "bm": "pool-bm"},
		MAASURL:         "http://127.0.0.1:5240/MAAS",
		PXEVLAN:         0,
		PXESubnets:      []string{"10.10.0.0/24"},
		CABundle:        TestCA,
		RoCEPool:        &proto.AddressPool{Subnet: "10.50.0.0/16", First: "10.50.0.10", Last: "10.50.3.250", MTU: 9000},
		IPoIBPool:       &proto.AddressPool{Subnet: "10.60.0.0/16", First: "10.60.0.10", Last: "10.60.3.250"},
		GuestSubnetPlan: &proto.GuestSubnetPlan{Supernet: "172.16.0.0/12", PrefixLen: 24},
		WipePolicy:      proto.WipeBlkdiscard,
	}
}

// SiteProfile returns a valid slice_vm profile "slice" of site "site-a".
func SiteProfile() proto.SiteProfile {
	return proto.SiteProfile{
		Site:                                 "site-a",
		Name:                                 "slice",
		Intent:                               proto.IntentSliceVM,
		SiteBootstrapBundleRef:               "sha256:" + repeat("ab", 32),
		StrictPXEPreflight:                   true,
		EnablePhase2RoCE:                     true,
		RequireHWSync:                        true,
		HardwareSyncInterval:                 proto.Duration(15 * time.Minute),
		ReleaseFallbackNoErase:               false,
		EnableDeployRetryOnDatasourceFailure: true,
		MaxDeployRetryAttempts:               2,
		AutoClaimSingleNewMachine:            false,
		BatchMaxParallel:                     4,
		EnrollmentTokenTTLSeconds:            3600,
		FabricMode:                           proto.FabricRoCE,
		StorageLayoutProfile:                 "flat",
		ReleaseMode:                          proto.ReleaseFullDecommission,
	}
}

func repeat(s string, n int) string {
	out := ""
	for range n {
		out += s
	}
	return out
}
