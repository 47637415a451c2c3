package sriov_test

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/hostops/sriov"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
)

const pf = "0000:58:00.0"

var quiet = slog.New(slog.DiscardHandler)

// recLinks is the recording VFLinks fake: it records every setter call as
// one line, can inject errors per call, and forwards to Next (the simulated
// kernel's rtnetlink, which keeps VF state and checks VF indexes).
type recLinks struct {
	Next sriov.VFLinks
	Fail map[string]error // call line -> injected error

	mu    sync.Mutex
	calls []string
}

// Calls returns and clears the recorded calls.
func (r *recLinks) Calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.calls
	r.calls = nil
	return out
}

func (r *recLinks) record(c string, next func() error) error {
	r.mu.Lock()
	r.calls = append(r.calls, c)
	err := r.Fail[c]
	r.mu.Unlock()
	if err != nil {
		return err
	}
	return next()
}

func (r *recLinks) VFInfo(nd string) ([]sriov.VFInfo, error) { return r.Next.VFInfo(nd) }

func (r *recLinks) SetVFHardwareAddr(nd string, vf int, mac net.HardwareAddr) error {
	return r.record(fmt.Sprintf("mac %s %d %s", nd, vf, mac), func() error { return r.Next.SetVFHardwareAddr(nd, vf, mac) })
}

func (r *recLinks) SetVFTrust(nd string, vf int, on bool) error {
	return r.record(fmt.Sprintf("trust %s %d %t", nd, vf, on), func() error { return r.Next.SetVFTrust(nd, vf, on) })
}

func (r *recLinks) SetVFSpoofchk(nd string, vf int, on bool) error {
	return r.record(fmt.Sprintf("spoofchk %s %d %t", nd, vf, on), func() error { return r.Next.SetVFSpoofchk(nd, vf, on) })
}

func host(t testing.TB) (hostops.Root, *pci.Recorder, *recLinks, *sriov.Manager) {
	t.Helper()
	root, k := hostsimtest.Host(t, "j22u15")
	rec := &pci.Recorder{Next: k}
	links := &recLinks{Next: k}
	return root, rec, links, &sriov.Manager{Root: root, W: rec, Links: links, Log: quiet}
}

func diff(t testing.TB, want []pci.Write, rec *pci.Recorder) {
	t.Helper()
	if d := cmp.Diff(want, rec.Writes()); d != "" {
		t.Errorf("sysfs writes (-want +got):\n%s", d)
	}
	rec.Reset()
}

func TestVFs(t *testing.T) {
	t.Parallel()
	_, _, _, m := host(t)
	vfs, err := m.VFs(pf)
	require.NoError(t, err)
	require.Len(t, vfs, 8)
	assert.Equal(t, sriov.VF{Index: 0, Addr: "0000:58:00.2", Driver: "mlx5_core", IOMMUGroup: vfs[0].IOMMUGroup}, vfs[0])
	assert.Equal(t, "0000:58:01.1", vfs[7].Addr)
	_, err = m.VFs("0000:18:00.0")
	assert.ErrorContains(t, err, "not an SR-IOV physical function")
	_, err = m.VFs("../58:00.0")
	assert.ErrorContains(t, err, "invalid PCI address")
}

func TestSetNumVFsTranscript(t *testing.T) {
	t.Parallel()
	root, rec, _, m := host(t)
	numvfs := "bus/pci/devices/0000:58:00.0/sriov_numvfs"

	require.NoError(t, m.SetNumVFs(pf, 8, nil))
	diff(t, nil, rec) // already 8: no writes

	require.NoError(t, m.SetNumVFs(pf, 12, nil))
	diff(t, []pci.Write{{Path: numvfs, Value: "0"}, {Path: numvfs, Value: "12"}}, rec)
	vfs, err := m.VFs(pf)
	require.NoError(t, err)
	assert.Len(t, vfs, 12)

	require.NoError(t, m.SetNumVFs(pf, 0, nil))
	diff(t, []pci.Write{{Path: numvfs, Value: "0"}}, rec)
	require.NoError(t, m.SetNumVFs(pf, 4, nil))
	diff(t, []pci.Write{{Path: numvfs, Value: "4"}}, rec)

	for _, bad := range []int{-1, 17} {
		assert.ErrorContains(t, m.SetNumVFs(pf, bad, nil), "want 0-16", bad)
	}
	assert.ErrorContains(t, m.SetNumVFs("0000:18:00.0", 1, nil), "not an SR-IOV")
	diff(t, nil, rec)

	// A PF without a driver cannot configure SR-IOV; refused before writing.
	require.NoError(t, hostsim.SetDriver(root, "0000:58:00.1", ""))
	assert.ErrorContains(t, m.SetNumVFs("0000:58:00.1", 2, nil), "no driver bound")
	diff(t, nil, rec)
}

func TestSetNumVFsRefusesClaimedVFs(t *testing.T) {
	t.Parallel()
	_, rec, _, m := host(t)
	claimed := []string{"0000:58:00.4", "0000:58:01.0", "0000:99:00.0" /* not this PF's */}

	err := m.SetNumVFs(pf, 16, claimed)
	var ce *sriov.ClaimedError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, &sriov.ClaimedError{PF: pf, From: 8, To: 16, Claimed: []string{"0000:58:00.4", "0000:58:01.0"}}, ce)
	assert.EqualError(t, err, "cannot change sriov_numvfs of 0000:58:00.0 from 8 to 16: VFs 0000:58:00.4, 0000:58:01.0 are claimed by slots (release them first)")
	require.ErrorAs(t, m.SetNumVFs(pf, 0, claimed), &ce)
	diff(t, nil, rec)
	vfs, err := m.VFs(pf)
	require.NoError(t, err)
	assert.Len(t, vfs, 8, "VFs untouched")

	// The same count with claims is fine (no change), and claims on other
	// PFs do not block.
	require.NoError(t, m.SetNumVFs(pf, 8, claimed))
	require.NoError(t, m.SetNumVFs(pf, 16, []string{"0000:99:00.0"}))
}

func TestConfigureVFTranscript(t *testing.T) {
	t.Parallel()
	_, rec, links, m := host(t)
	mac := net.HardwareAddr{0x02, 0x67, 0x70, 0x75, 0x00, 0x03}
	cfg := sriov.VFConfig{MAC: mac, Trust: true, SpoofCheck: false}

	require.NoError(t, m.ConfigureVF("0000:58:00.5", cfg))
	if d := cmp.Diff([]string{
		"mac enp88s0f0np0 3 02:67:70:75:00:03",
		"trust enp88s0f0np0 3 true",
		"spoofchk enp88s0f0np0 3 false",
	}, links.Calls()); d != "" {
		t.Errorf("netlink calls (-want +got):\n%s", d)
	}
	require.NoError(t, m.ConfigureVF("0000:58:00.5", cfg))
	assert.Empty(t, links.Calls(), "converged VF: no netlink calls")

	cfg.Trust = false
	require.NoError(t, m.ConfigureVF("0000:58:00.5", cfg))
	assert.Equal(t, []string{"trust enp88s0f0np0 3 false"}, links.Calls())
	diff(t, nil, rec) // no sysfs writes for VF settings

	pfAddr, idx, nd, err := m.Locate("0000:58:01.1")
	require.NoError(t, err)
	assert.Equal(t, []any{pf, 7, "enp88s0f0np0"}, []any{pfAddr, idx, nd})

	for _, tc := range []struct {
		addr string
		mac  net.HardwareAddr
		want string
	}{
		{"0000:58:00.5", net.HardwareAddr{0x01, 0, 0, 0, 0, 1}, "multicast"},
		{"0000:58:00.5", make(net.HardwareAddr, 6), "all-zero"},
		{"0000:58:00.5", net.HardwareAddr{1, 2}, "6-byte"},
		{"0000:18:00.0", mac, "not a virtual function"},
		{"0000:58:03.0", mac, "no such PCI function"},
		{"x/../../y", mac, "invalid PCI address"},
	} {
		assert.ErrorContains(t, m.ConfigureVF(tc.addr, sriov.VFConfig{MAC: tc.mac}), tc.want, tc.addr)
	}
	assert.Empty(t, links.Calls())

	// A netlink failure is reported with the PF netdev and VF index.
	links.Fail = map[string]error{"spoofchk enp88s0f0np0 0 false": errors.New("operation not supported")}
	err = m.ConfigureVF("0000:58:00.2", sriov.VFConfig{MAC: mac})
	assert.EqualError(t, err, "configure VF 0000:58:00.2 (enp88s0f0np0 vf 0): set spoof-check false: operation not supported")
}

// TestVFConvergence applies random VF configurations and counts in random
// order against the in-memory fake: each round converges, a repeat does
// nothing.
func TestVFConvergence(t *testing.T) {
	t.Parallel()
	root, k := hostsimtest.Host(t, "j22u15")
	rec := &pci.Recorder{Next: k}
	links := &recLinks{Next: k}
	m := &sriov.Manager{Root: root, W: rec, Links: links, Log: quiet}
	rng := rand.New(rand.NewPCG(3, 9))
	for round := range 10 {
		n := 1 + rng.IntN(16)
		require.NoError(t, m.SetNumVFs(pf, n, nil))
		vfs, err := m.VFs(pf)
		require.NoError(t, err)
		require.Len(t, vfs, n)
		want := map[string]sriov.VFConfig{}
		for _, vf := range vfs {
			want[vf.Addr] = sriov.VFConfig{
				MAC:        net.HardwareAddr{0x02, 0, 0, byte(round), byte(vf.Index), 1},
				Trust:      rng.IntN(2) == 0,
				SpoofCheck: rng.IntN(2) == 0,
			}
		}
		apply := func() {
			for _, i := range rng.Perm(len(vfs)) {
				require.NoError(t, m.ConfigureVF(vfs[i].Addr, want[vfs[i].Addr]))
			}
		}
		apply()
		infos, err := k.VFInfo("enp88s0f0np0")
		require.NoError(t, err)
		for _, vf := range vfs {
			w := want[vf.Addr]
			got := infos[vf.Index]
			assert.Equal(t, w.MAC.String(), got.MAC.String())
			assert.Equal(t, []bool{w.Trust, w.SpoofCheck}, []bool{got.Trust, got.SpoofCheck})
		}
		links.Calls()
		rec.Reset()
		apply()
		require.NoError(t, m.SetNumVFs(pf, n, nil))
		assert.Empty(t, links.Calls(), "round %d", round)
		assert.Empty(t, rec.Writes(), "round %d", round)
	}
}
