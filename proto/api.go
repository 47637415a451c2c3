package proto

import (
	"strings"
)

// MaxBodyBytes bounds every API request body.
const MaxBodyBytes = 1 << 20

// IdempotencyKeyHeader carries the client's idempotency key on
// allocation create.
const IdempotencyKeyHeader = "Idempotency-Key"

// AllocationCreateRequest is the operator's request for capacity.
type AllocationCreateRequest struct {
	CapacityShape CapacityShape `json:"capacity_shape"`
	SKU           string        `json:"sku"`
	GPUCount      int           `json:"gpu_count"`
	Region        string        `json:"region"`
	Image         string        `json:"image,omitempty"`
	SSHPublicKeys []string      `json:"ssh_public_keys,omitempty"`
	Owner         string        `json:"owner,omitempty"`
	// Ingress are public ingress rules ("tcp/22") to open with the
	// allocation; the site must declare public addressing.
	Ingress []string `json:"ingress,omitempty"`
}

// Validate checks the request against the SKU catalog. It returns an
// *Error with CodeInvalidArgument naming the first problem.
func (r AllocationCreateRequest) Validate(skus []SKU) error {
	if !r.CapacityShape.Valid() {
		return Errorf(CodeInvalidArgument, "capacity_shape %q is not one of baremetal, gpu_slice", r.CapacityShape)
	}
	sku, ok := FindSKU(skus, r.SKU)
	if !ok {
		names := make([]string, len(skus))
		for i, s := range skus {
			names[i] = s.Name
		}
		return Errorf(CodeInvalidArgument, "sku %q is unknown; known: %s", r.SKU, strings.Join(names, ", "))
	}
	if sku.Shape != r.CapacityShape {
		return Errorf(CodeInvalidArgument, "sku %s sells %s, not %s", sku.Name, sku.Shape, r.CapacityShape)
	}
	if r.CapacityShape == ShapeGPUSlice && !sku.AllowsGPUCount(r.GPUCount) {
		return Errorf(CodeInvalidArgument, "gpu_count %d is not allowed for %s (allowed: %v)", r.GPUCount, sku.Name, sku.AllowedGPUCounts)
	}
	if r.CapacityShape == ShapeBaremetal && r.GPUCount != 0 && !sku.AllowsGPUCount(r.GPUCount) {
		return Errorf(CodeInvalidArgument, "gpu_count %d is not allowed for %s (a baremetal node has %v)", r.GPUCount, sku.Name, sku.AllowedGPUCounts)
	}
	if err := ValidateID("region", r.Region); err != nil {
		return err
	}
	if len(r.SSHPublicKeys) > MaxSSHKeys {
		return Errorf(CodeInvalidArgument, "%d ssh_public_keys given; at most %d are allowed", len(r.SSHPublicKeys), MaxSSHKeys)
	}
	for i, k := range r.SSHPublicKeys {
		if len(k) > MaxSSHKeyBytes || !strings.HasPrefix(k, "ssh-") && !strings.HasPrefix(k, "ecdsa-") {
			return Errorf(CodeInvalidArgument, "ssh_public_keys[%d] is not an OpenSSH public key", i)
		}
		if !printableLine(k) {
			return Errorf(CodeInvalidArgument, "ssh_public_keys[%d] is not one line of printable text", i)
		}
	}
	if r.Owner != "" {
		if err := ValidateID("owner", r.Owner); err != nil {
			return err
		}
	}
	if r.Image != "" {
		if _, _, err := ParseImageSpec(r.Image); err != nil {
			return err
		}
	}
	if len(r.Ingress) > 0 {
		if r.CapacityShape != ShapeGPUSlice {
			return Errorf(CodeInvalidArgument, "ingress is for gpu_slice allocations (a baremetal node is the tenant's to address)")
		}
		if _, err := ParseIngressRules(r.Ingress); err != nil {
			return err
		}
	}
	return nil
}

// ValidateIdempotencyKey checks a client-supplied key: 1–128 printable
// ASCII characters.
func ValidateIdempotencyKey(k string) error {
	if k == "" || len(k) > 128 {
		return Errorf(CodeInvalidArgument, "%s must be 1 to 128 characters, got %d", IdempotencyKeyHeader, len(k))
	}
	for _, c := range k {
		if c < 0x21 || c > 0x7e {
			return Errorf(CodeInvalidArgument, "%s has a character outside printable ASCII", IdempotencyKeyHeader)
		}
	}
	return nil
}
