package proto

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSlotCapacityOverrideApply(t *testing.T) {
	base := SlotCapacity{GPUPCIAddress: "0000:18:00.0", NUMANode: 1, PCIeSwitch: "sw0", NVMe: DiskIdentity{Serial: "S1"},
		ManagementMAC: "52:54:00:00:00:01", PrivateIP: "10.77.0.11", FabricClaimMode: FabricPerSlotVF, FabricVFPCIAddress: "0000:1a:00.2"}
	var nilOverride *SlotCapacityOverride
	assert.Equal(t, base, nilOverride.Apply(base))
	assert.Equal(t, base, (&SlotCapacityOverride{}).Apply(base))

	ip, zero, vf := "10.77.9.9", 0, ""
	got := (&SlotCapacityOverride{PrivateIP: &ip, NUMANode: &zero, FabricVFPCIAddress: &vf, NVMe: &DiskIdentity{WWN: "eui.1"}}).Apply(base)
	want := base
	want.PrivateIP, want.NUMANode, want.FabricVFPCIAddress, want.NVMe = ip, 0, "", DiskIdentity{WWN: "eui.1"}
	assert.Equal(t, want, got)
	assert.Equal(t, []string{"fabric_vf_pci_address"}, got.MissingBindings(), "an override can make a slot incomplete")
	assert.Equal(t, "10.77.0.11", base.PrivateIP, "the input is not modified")
}

func TestProblemFor(t *testing.T) {
	p := ProblemFor(CodeNoCapacity, "16 GPUs free, none with 4 on one node")
	assert.Equal(t, Problem{Type: "urn:gpuaas:problem:no_capacity", Title: "No capacity", Status: http.StatusUnprocessableEntity,
		Detail: "16 GPUs free, none with 4 on one node", Code: CodeNoCapacity}, p)
	seen := map[Code]bool{}
	for _, c := range Codes {
		require.False(t, seen[c], "%s listed twice", c)
		seen[c] = true
		assert.NotEmpty(t, c.Title())
	}
	assert.Equal(t, http.StatusMethodNotAllowed, CodeMethodNotAllowed.HTTPStatus())
}
