package proto

import (
	"strings"

	"golang.org/x/crypto/ssh"
)

// CheckSSHPublicKeys parses each key as one OpenSSH authorized_keys line
// (type, base64 key, optional comment), as the slice seed and the guest
// do before they authorize it. The API runs it on every allocation
// create, so a mistyped key is refused with 400 instead of failing the
// provision on the host (a failed seed leaves its slot cleanup_blocked
// and counts toward the node's breaker). It is deliberately not part of
// AllocationCreateRequest.Validate, which the ledger's FSM also runs on
// every replica: a stricter check there would refuse, on replay by a
// newer version, log entries an older one accepted.
func CheckSSHPublicKeys(keys []string) error {
	for i, k := range keys {
		if strings.ContainsAny(k, "\r\n") {
			return Errorf(CodeInvalidArgument, "ssh_public_keys[%d] contains a line break; give one key per entry", i)
		}
		_, _, _, rest, err := ssh.ParseAuthorizedKey([]byte(k))
		if err != nil {
			return Errorf(CodeInvalidArgument, "ssh_public_keys[%d] is not an OpenSSH public key (%v); give the one line of a .pub file, e.g. \"ssh-ed25519 AAAAC3... you@host\"", i, err)
		}
		if len(rest) != 0 {
			return Errorf(CodeInvalidArgument, "ssh_public_keys[%d] has data after the key", i)
		}
	}
	return nil
}
