package proto

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Validation of the slice runtime reports of slice.go. The coordinator
// checks every report an agent sends before it records anything: a
// malformed result is refused whole.

// Bounds of the slice runtime reports.
const (
	MaxStageMessage   = 4096 // StageEvent.Message
	MaxAccessField    = 255  // SliceAccess fields except SSHCommand
	MaxSSHCommand     = 1024 // SliceAccess.SSHCommand
	MaxEvidenceItems  = 64   // SlotReadiness.Evidence entries
	MaxEvidenceLen    = 512  // one evidence entry
	MaxDurations      = 32   // Durations entries
	MaxSlotError      = 4096 // SlotResult.Error
	MaxHealthDetail   = 1024 // Slot.HealthDetail (as the ledger bounds it)
	MaxTransitionText = 1024 // an allocation's reason
)

var unixUser = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// Validate checks a stage event: the stage an identifier, the status one
// of TimelineStatuses, the message bounded.
func (e *StageEvent) Validate() error {
	if err := ValidateID("event stage", e.Stage); err != nil {
		return err
	}
	if !slices.Contains(TimelineStatuses, e.Status) {
		return Errorf(CodeInvalidArgument, "event status %q is not one of %s", truncate(e.Status, 32), strings.Join(TimelineStatuses, ", "))
	}
	if len(e.Message) > MaxStageMessage {
		return Errorf(CodeInvalidArgument, "event message is %d bytes; at most %d are allowed", len(e.Message), MaxStageMessage)
	}
	return nil
}

// Validate checks a slice's access: a guest IP and MAC that parse, a
// jump host that is an address or a host name, a Unix user name, and a
// one-line SSH command.
func (a *SliceAccess) Validate() error {
	if _, err := netip.ParseAddr(a.GuestIP); err != nil {
		return Errorf(CodeInvalidArgument, "access.guest_ip %q is not an IP address", truncate(a.GuestIP, 64))
	}
	if _, err := net.ParseMAC(a.GuestMAC); err != nil || len(a.GuestMAC) != 17 {
		return Errorf(CodeInvalidArgument, "access.guest_mac %q is not a MAC address (aa:bb:cc:dd:ee:ff)", truncate(a.GuestMAC, 64))
	}
	if a.JumpHost != "" {
		if len(a.JumpHost) > MaxAccessField {
			return Errorf(CodeInvalidArgument, "access.jump_host is %d characters; at most %d are allowed", len(a.JumpHost), MaxAccessField)
		}
		if _, err := netip.ParseAddr(a.JumpHost); err != nil && !validHostname(a.JumpHost) {
			return Errorf(CodeInvalidArgument, "access.jump_host %q is neither an IP address nor a host name", truncate(a.JumpHost, 64))
		}
	}
	if a.User != "" && !unixUser.MatchString(a.User) {
		return Errorf(CodeInvalidArgument, "access.user %q is not a user name ([a-z_][a-z0-9_-], at most 32)", truncate(a.User, 64))
	}
	if len(a.SSHCommand) > MaxSSHCommand {
		return Errorf(CodeInvalidArgument, "access.ssh_command is %d characters; at most %d are allowed", len(a.SSHCommand), MaxSSHCommand)
	}
	if !printableLine(a.SSHCommand) {
		return Errorf(CodeInvalidArgument, "access.ssh_command must be one line of printable text")
	}
	return nil
}

// SSH returns the command that reaches the slice: SSHCommand when the
// agent gave one, else ssh -J through the jump host.
func (a *SliceAccess) SSH() string {
	if a.SSHCommand != "" {
		return a.SSHCommand
	}
	user := a.User
	if user == "" {
		user = "root"
	}
	if a.JumpHost == "" {
		return "ssh " + user + "@" + a.GuestIP
	}
	return "ssh -J root@" + a.JumpHost + " " + user + "@" + a.GuestIP
}

func validHostname(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

func printableLine(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// ReadinessHealth maps a slot's readiness health_state to the ledger's
// slot health: ready → healthy, failed → unhealthy; the ledger's own
// states pass through. ok is false for anything else.
func ReadinessHealth(s string) (health string, ok bool) {
	switch s {
	case "ready":
		return HealthHealthy, true
	case "failed":
		return HealthUnhealthy, true
	case HealthHealthy, HealthDegraded, HealthUnhealthy, HealthUnknown:
		return s, true
	}
	return "", false
}

// ReadinessDetail is a slot's health detail from an allocation's passed
// readiness gate: the evidence, labelled with the allocation it proves
// (clipped to MaxHealthDetail).
func ReadinessDetail(allocID string, evidence []string) string {
	return Clip(readinessLabel(allocID)+strings.Join(evidence, "; "), MaxHealthDetail)
}

// IsReadinessDetailOf reports whether a slot's health detail is the
// readiness evidence of allocation allocID (ReadinessDetail), or evidence
// recorded before details were labelled (it begins with the gate's
// "dhcp: " evidence): it describes that allocation's guest, not the slot
// once the allocation is over.
func IsReadinessDetailOf(detail, allocID string) bool {
	return strings.HasPrefix(detail, readinessLabel(allocID)) || strings.HasPrefix(detail, "dhcp: ")
}

func readinessLabel(allocID string) string { return "readiness of allocation " + allocID + ": " }

// IsSliceResult reports whether a task result is one of the slice
// runtime's results (an object with allocation_id) rather than an older
// agent's plain result (the node scheduler's plan, or a release count).
func IsSliceResult(raw json.RawMessage) bool {
	var probe map[string]json.RawMessage
	if json.Unmarshal(raw, &probe) != nil {
		return false
	}
	_, ok := probe["allocation_id"]
	return ok
}

// DecodeResult decodes a task result strictly: unknown fields, trailing
// data, duplicate keys and case-mismatched field names are refused.
func DecodeResult(what string, raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Errorf(CodeInvalidArgument, "%s: %v", what, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Errorf(CodeInvalidArgument, "%s: unexpected data after the JSON object", what)
	}
	if err := CheckJSONKeys(raw, v); err != nil {
		return Errorf(CodeInvalidArgument, "%s: %s", what, err.(*Error).Detail)
	}
	return nil
}

// slotSet checks that ids are distinct members of slots (the slots the
// task was given); field names the list in errors.
func slotSet(field string, ids, slots []string) error {
	seen := map[string]bool{}
	for _, id := range ids {
		if !slices.Contains(slots, id) {
			return Errorf(CodeInvalidArgument, "%s: slot %q is not a slot of this task (%s)", field, truncate(id, 64), strings.Join(slots, ", "))
		}
		if seen[id] {
			return Errorf(CodeInvalidArgument, "%s: slot %s is listed twice", field, id)
		}
		seen[id] = true
	}
	return nil
}

func validateDurations(d map[string]int64) error {
	if len(d) > MaxDurations {
		return Errorf(CodeInvalidArgument, "durations_ms has %d entries; at most %d are allowed", len(d), MaxDurations)
	}
	for k, v := range d {
		if err := ValidateID("durations_ms key", k); err != nil {
			return err
		}
		if v < 0 {
			return Errorf(CodeInvalidArgument, "durations_ms[%s] is negative", k)
		}
	}
	return nil
}

// Validate checks a provision result against its task: the allocation,
// the task's slots and the outcome. A success carries Access and the
// readiness of every slot (ready or degraded) and no failed stage; a
// failure names its stage and the slots it touched.
func (r *SliceProvisionResult) Validate(allocID string, slots []string, succeeded bool) error {
	if r.AllocationID != allocID {
		return Errorf(CodeInvalidArgument, "result allocation_id %q is not the task's allocation %s", truncate(r.AllocationID, 64), allocID)
	}
	if len(r.Domain) > MaxAccessField || !printableLine(r.Domain) {
		return Errorf(CodeInvalidArgument, "result domain must be one printable line of at most %d characters", MaxAccessField)
	}
	ids := make([]string, len(r.Slots))
	for i, s := range r.Slots {
		ids[i] = s.SlotID
		h, ok := ReadinessHealth(s.HealthState)
		if !ok {
			return Errorf(CodeInvalidArgument, "slot %s: health_state %q is not ready, failed, healthy, degraded, unhealthy or unknown", s.SlotID, truncate(s.HealthState, 32))
		}
		if succeeded && h != HealthHealthy && h != HealthDegraded {
			return Errorf(CodeInvalidArgument, "slot %s: a succeeded provision reports health_state %q; the readiness gate passes only ready slots", s.SlotID, s.HealthState)
		}
		if len(s.Evidence) > MaxEvidenceItems {
			return Errorf(CodeInvalidArgument, "slot %s: %d evidence items; at most %d are allowed", s.SlotID, len(s.Evidence), MaxEvidenceItems)
		}
		for _, e := range s.Evidence {
			if len(e) > MaxEvidenceLen {
				return Errorf(CodeInvalidArgument, "slot %s: an evidence item is %d bytes; at most %d are allowed", s.SlotID, len(e), MaxEvidenceLen)
			}
		}
	}
	if err := slotSet("result slots", ids, slots); err != nil {
		return err
	}
	if err := slotSet("result touched_slots", r.TouchedSlots, slots); err != nil {
		return err
	}
	if err := validateDurations(r.Durations); err != nil {
		return err
	}
	if succeeded {
		switch {
		case r.FailedStage != "" || len(r.TouchedSlots) > 0:
			return Errorf(CodeInvalidArgument, "a succeeded provision names failed_stage %q or touched_slots", truncate(r.FailedStage, 32))
		case r.Access == nil:
			return Errorf(CodeInvalidArgument, "a succeeded provision must carry access (how to reach the slice)")
		case len(ids) != len(slots):
			return Errorf(CodeInvalidArgument, "a succeeded provision must report the readiness of every slot (%d of %d reported)", len(ids), len(slots))
		}
		return r.Access.Validate()
	}
	if r.FailedStage != "" {
		if err := ValidateID("result failed_stage", r.FailedStage); err != nil {
			return err
		}
	}
	if r.Access != nil {
		return Errorf(CodeInvalidArgument, "a failed provision carries no access")
	}
	return nil
}

// Validate checks a wipe proof (what slotID names in errors).
func (p *WipeProof) Validate(slotID string) error {
	if !slices.Contains(WipeMethods, p.Method) {
		return Errorf(CodeInvalidArgument, "slot %s: wipe proof method %q is not one of %s", slotID, truncate(p.Method, 32), strings.Join(WipeMethods, ", "))
	}
	if p.Bytes == 0 || p.VerifiedAt.IsZero() {
		return Errorf(CodeInvalidArgument, "slot %s: wipe proof needs bytes > 0 and verified_at", slotID)
	}
	if p.DurationMS < 0 || p.Samples < 0 || len(p.SampleDigest) > MaxAccessField {
		return Errorf(CodeInvalidArgument, "slot %s: wipe proof duration and samples must be non-negative, sample_digest at most %d characters", slotID, MaxAccessField)
	}
	return nil
}

// Validate checks a release result against its task's allocation and
// slots: each slot at most once, with a valid proof or a bounded error.
func (r *SliceReleaseResult) Validate(allocID string, slots []string) error {
	if r.AllocationID != allocID {
		return Errorf(CodeInvalidArgument, "result allocation_id %q is not the task's allocation %s", truncate(r.AllocationID, 64), allocID)
	}
	ids := make([]string, len(r.Slots))
	for i, s := range r.Slots {
		ids[i] = s.SlotID
		if s.Proof != nil {
			if err := s.Proof.Validate(s.SlotID); err != nil {
				return err
			}
		}
		if len(s.Error) > MaxSlotError {
			return Errorf(CodeInvalidArgument, "slot %s: error is %d bytes; at most %d are allowed", s.SlotID, len(s.Error), MaxSlotError)
		}
	}
	if err := slotSet("result slots", ids, slots); err != nil {
		return err
	}
	return validateDurations(r.Durations)
}

// Validate checks a slot cleanup result against its task's slot.
func (r *SlotCleanupResult) Validate(slotID string) error {
	if r.SlotID != slotID {
		return Errorf(CodeInvalidArgument, "result slot_id %q is not the task's slot %s", truncate(r.SlotID, 64), slotID)
	}
	return r.Proof.Validate(slotID)
}

// Clip shortens s to at most n bytes on a rune boundary, marking the cut
// with "...".
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - 3
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s...", s[:cut])
}
