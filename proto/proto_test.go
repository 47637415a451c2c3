package proto

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEncodeDecode(t *testing.T) {
	want := NodeDrainRequest{At: time.Date(2026, 11, 25, 23, 0, 0, 123, time.UTC), NodeID: "n1", Draining: true}
	b, err := Encode(NodeDrainType, want)
	require.NoError(t, err)
	typ, body, err := Decode(b)
	require.NoError(t, err)
	require.Equal(t, NodeDrainType, typ)
	require.Equal(t, CodecMsgpackV1, body[0], "binary body behind a version byte")
	var got NodeDrainRequest
	require.NoError(t, DecodeBody(body, &got))
	require.Equal(t, want, got)
	again, err := Encode(NodeDrainType, got)
	require.NoError(t, err)
	require.Equal(t, b, again, "the same value encodes to the same bytes")
	_, _, err = Decode(nil)
	require.Error(t, err)
}

// A log written before the binary codec holds JSON bodies: they decode to
// the same value; a body behind an unknown version byte is refused.
func TestDecodeBodyReadsLegacyJSONAndRefusesUnknownVersions(t *testing.T) {
	want := NodeSetStateRequest{At: time.Date(2026, 11, 25, 23, 0, 0, 0, time.UTC), NodeID: "n1", State: NodeActive, Reason: "r"}
	legacy, err := EncodeJSON(NodeSetStateType, want)
	require.NoError(t, err)
	require.Equal(t, byte('{'), legacy[1])
	for _, body := range [][]byte{legacy[1:], append([]byte(" \n\t"), legacy[1:]...)} {
		var got NodeSetStateRequest
		require.NoError(t, DecodeBody(body, &got))
		require.Equal(t, want, got)
	}
	bin, err := Encode(NodeSetStateType, want)
	require.NoError(t, err)
	for _, v := range []byte{0x00, 0x02, 0x1f} {
		body := append([]byte{v}, bin[2:]...)
		var got NodeSetStateRequest
		err := DecodeBody(body, &got)
		require.ErrorContains(t, err, fmt.Sprintf("unknown body codec version %d", v))
		require.Equal(t, NodeSetStateRequest{}, got, "a refused body decodes nothing")
	}
	var got NodeSetStateRequest
	require.ErrorContains(t, DecodeBody(nil, &got), "empty body")
	require.ErrorContains(t, DecodeBody(append(bin[1:], 0xc0), &got), "trailing bytes")
	require.Error(t, DecodeBody(bin[1:len(bin)-3], &got), "truncated body")
}

func TestMessageTypesNamedAndBelowFlag(t *testing.T) {
	for typ, name := range messageTypeNames {
		require.Less(t, uint8(typ), uint8(IgnoreUnknownTypeFlag), name)
		require.Equal(t, name, typ.String())
	}
	require.Equal(t, "node_drain", (NodeDrainType | IgnoreUnknownTypeFlag).String())
}

func TestTransitions(t *testing.T) {
	require.NoError(t, CheckSlotTransition("place", "s", SlotAvailable, SlotReserved))
	err := CheckSlotTransition("place", "n1-s0", SlotCleanupBlocked, SlotReserved)
	require.Equal(t, CodeIllegalTransition, CodeOf(err))
	require.ErrorContains(t, err, "n1-s0 cannot move from cleanup_blocked to reserved")
	require.Error(t, CheckAllocTransition("x", "a", AllocReleased, AllocActive))
	require.Error(t, CheckAllocTransition("x", "a", AllocFailed, AllocReleasing))
	for _, s := range SlotStatuses {
		require.True(t, s.Valid())
	}
	for _, s := range AllocStates {
		require.True(t, s.Valid())
	}
	require.False(t, SlotStatus("bogus").Valid())
}

func TestMissingBindings(t *testing.T) {
	c := SlotCapacity{GPUPCIAddress: "0000:18:00.0", NVMe: DiskIdentity{Serial: "S1"}, ManagementMAC: "52:54:00:00:00:01",
		PrivateIP: "10.77.0.11", FabricClaimMode: FabricPerSlotVF, FabricVFPCIAddress: "0000:a1:00.2"}
	require.Empty(t, c.MissingBindings())
	c.FabricVFPCIAddress = ""
	c.FabricClaimMode = "shared"
	require.Equal(t, []string{"fabric_claim_mode=per_slot_vf", "fabric_vf_pci_address"}, c.MissingBindings())
}

func TestValidateID(t *testing.T) {
	require.NoError(t, ValidateID("node", "j22u15"))
	for _, bad := range []string{"", "UPPER", "-lead", "a/b", "a b", string(make([]byte, 200))} {
		require.Equal(t, CodeInvalidArgument, CodeOf(ValidateID("node", bad)), "%q", bad)
	}
}

func TestDefaultSKUs(t *testing.T) {
	s, ok := FindSKU(DefaultSKUs(), "h200-sxm-slice")
	require.True(t, ok)
	require.Equal(t, ShapeGPUSlice, s.Shape)
	require.True(t, s.AllowsGPUCount(4))
	require.False(t, s.AllowsGPUCount(3))
	require.Equal(t, 24, s.PerGPU.VCPUs)
}

func TestAllocationCreateValidate(t *testing.T) {
	skus := DefaultSKUs()
	ok := AllocationCreateRequest{CapacityShape: ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 2, Region: "us-east"}
	require.NoError(t, ok.Validate(skus))
	for name, mut := range map[string]func(*AllocationCreateRequest){
		"capacity_shape":     func(r *AllocationCreateRequest) { r.CapacityShape = "vm" },
		"unknown":            func(r *AllocationCreateRequest) { r.SKU = "a100" },
		"gpu_count 3":        func(r *AllocationCreateRequest) { r.GPUCount = 3 },
		"region":             func(r *AllocationCreateRequest) { r.Region = "" },
		"sells":              func(r *AllocationCreateRequest) { r.CapacityShape = ShapeBaremetal },
		"ssh_public_keys[0]": func(r *AllocationCreateRequest) { r.SSHPublicKeys = []string{"garbage"} },
	} {
		r := ok
		mut(&r)
		err := r.Validate(skus)
		require.ErrorContains(t, err, name)
		require.Equal(t, CodeInvalidArgument, CodeOf(err))
	}
	require.Error(t, ValidateIdempotencyKey(""))
	require.Error(t, ValidateIdempotencyKey("a b"))
	require.NoError(t, ValidateIdempotencyKey("key-1"))
}
