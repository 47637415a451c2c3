package cli

import (
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/proto"
)

// execProcess replaces gpuaasctl with another program (ssh).
var execProcess = syscall.Exec

// sshOptions are the alloc ssh flags.
type sshOptions struct {
	identity string // -i
	direct   bool   // never jump
	print    bool   // print the command instead of running it
	// knownHosts is a known_hosts file holding the guest's host keys as
	// its agent saw them: ssh then verifies the guest strictly.
	knownHosts string
}

// writeKnownHosts writes the allocation's pinned guest host keys as a
// known_hosts file of its own under the user's cache folder and returns
// its path ("" when the access names no key). Guest addresses are reused
// by later slices with new keys, so one shared known_hosts would either
// warn of a changed key or trust the first key it saw.
func writeKnownHosts(id string, acc *proto.SliceAccess) (string, error) {
	if len(acc.HostKeys) == 0 {
		return "", nil
	}
	var b strings.Builder
	for _, k := range acc.HostKeys {
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil || strings.ContainsAny(k, "\n\r") {
			return "", fmt.Errorf("allocation %s: host key %q is not an OpenSSH public key", id, k)
		}
		fmt.Fprintf(&b, "%s %s\n", acc.GuestIP, k)
	}
	dir := knownHostsDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("known_hosts folder: %w", err)
	}
	path := filepath.Join(dir, id)
	if err := atomicfile.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return "", fmt.Errorf("known_hosts of %s: %w", id, err)
	}
	return path, nil
}

// forgetKnownHosts removes the allocation's pinned host keys once it is
// released (its guest address and endpoint go to later slices with new
// keys); a pin that was never written is no error.
func forgetKnownHosts(id string) {
	// Best effort: a pin left behind only costs a file.
	_ = os.Remove(filepath.Join(knownHostsDir(), filepath.Base(id)))
}

// knownHostsDir is the folder of the allocations' pinned host keys, in
// the user's cache folder.
func knownHostsDir() string {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	return filepath.Join(cache, "gpuaas", "known_hosts")
}

// isLoopback reports whether a jump host names this machine: jumping
// through it adds nothing, the guest network is reachable from here.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// jumpSpec is the -J argument: the one the agent's SSH command names for
// the jump host when it names one, else root@host (proto.SliceAccess.SSH).
func jumpSpec(acc *proto.SliceAccess) string {
	f := strings.Fields(acc.SSHCommand)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-J" {
			spec := f[i+1]
			host := spec[strings.LastIndex(spec, "@")+1:]
			if host == acc.JumpHost {
				return spec
			}
		}
	}
	return "root@" + acc.JumpHost
}

// sshArgv is the ssh command line for an allocation's access: the
// identity, the jump host (dropped when it is this machine or with
// --direct), user@guest, then the caller's extra arguments (ssh accepts
// options after the destination; the rest is the remote command).
func sshArgv(acc *proto.SliceAccess, o sshOptions, extra []string) []string {
	argv := []string{"ssh"}
	if o.identity != "" {
		argv = append(argv, "-i", o.identity)
	}
	if o.knownHosts != "" {
		argv = append(argv, "-o", "UserKnownHostsFile="+o.knownHosts, "-o", "StrictHostKeyChecking=yes")
	}
	if acc.JumpHost != "" && !o.direct && !isLoopback(acc.JumpHost) {
		argv = append(argv, "-J", jumpSpec(acc))
	}
	user := acc.User
	if user == "" {
		user = "root"
	}
	argv = append(argv, user+"@"+acc.GuestIP)
	return append(argv, extra...)
}

// sshCommand is the command alloc ssh --print gives for an allocation's
// access (a jump host that is this machine dropped); alloc create --wait
// and alloc show print the same.
func sshCommand(acc *proto.SliceAccess) string {
	return shellJoin(sshArgv(acc, sshOptions{}, nil))
}

// noKeyNote says, for an allocation created without an SSH key, that no
// key of the caller's opens it and how a key is given ("" when it has
// keys).
func noKeyNote(al proto.Allocation) string {
	if len(al.SSHPublicKeys) > 0 {
		return ""
	}
	return "no key of yours is authorized: the allocation was created without --ssh-key " +
		"(keys are given at create: alloc create ... --ssh-key \"$(cat ~/.ssh/id_ed25519.pub)\")"
}

// sshNotes are what alloc ssh tells the caller on stderr before running
// ssh: that no key of theirs opens the allocation, and for a baremetal
// allocation that it reaches the machine MAAS deployed, whose host key
// is not pinned.
func sshNotes(al proto.Allocation) []string {
	var notes []string
	if note := noKeyNote(al); note != "" {
		notes = append(notes, "warning: "+note)
	}
	if al.Shape == proto.ShapeBaremetal && al.Access != nil && len(al.Access.HostKeys) == 0 {
		notes = append(notes, fmt.Sprintf("note: baremetal node %s at %s, the address MAAS deployed it with; its host key is not pinned (ssh asks on first use)", al.NodeID, al.Access.GuestIP))
	}
	return notes
}

// sliceAccess returns the SSH access of an active allocation, or an
// error saying why there is none.
func sliceAccess(al proto.Allocation) (*proto.SliceAccess, error) {
	if al.State != proto.AllocActive {
		hint := "follow it with: gpuaasctl alloc show " + al.ID
		if al.State == proto.AllocFailed || al.State == proto.AllocReleased || al.State == proto.AllocReleasing {
			hint = "it will not become reachable"
		}
		return nil, fmt.Errorf("allocation %s is %s, not active: it has no SSH access (%s)", al.ID, al.State, hint)
	}
	if al.Access == nil || al.Access.GuestIP == "" {
		if al.Shape == proto.ShapeBaremetal {
			return nil, fmt.Errorf("allocation %s is a baremetal node with no SSH address recorded (its MAAS deployment reported none): reach the node (%s) through its own address", al.ID, al.NodeID)
		}
		return nil, fmt.Errorf("allocation %s is active but its agent recorded no SSH access for it", al.ID)
	}
	return al.Access, nil
}

func (a *app) allocSSHCmd() *cobra.Command {
	var o sshOptions
	c := &cobra.Command{
		Use:   "ssh ID [-- SSH-ARGS...]",
		Short: "SSH into an active slice: runs ssh with its user, guest address and jump host",
		Long: "Look up the allocation's access (as recorded when it became active) and run ssh with the\n" +
			"guest's user and address, through the jump host the agent named. A jump host that is this\n" +
			"machine (loopback, as in the lab) is skipped: the guest network is reachable from here.\n" +
			"The guest's host key, as the agent saw it when the slice became ready, is pinned: ssh\n" +
			"checks it strictly against a known_hosts file of the allocation's own (no first-use prompt,\n" +
			"no warning when a later slice reuses the address).\n" +
			"Arguments after -- go to ssh after the destination: more options, then a remote command.",
		Example: "  gpuaasctl alloc ssh ID -i /tmp/lab-key\n" +
			"  gpuaasctl alloc ssh ID -i /tmp/lab-key -- -o StrictHostKeyChecking=accept-new uname -a\n" +
			"  gpuaasctl alloc ssh ID --print",
		Args: func(cmd *cobra.Command, args []string) error {
			n := cmd.ArgsLenAtDash()
			if n < 0 {
				n = len(args)
			}
			if n != 1 {
				return usagef("alloc ssh takes the allocation ID (then optional ssh arguments after --); got %d arguments before --", n)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			id, extra := args[0], args[1:]
			r, err := a.call(cmd, http.MethodGet, "/v1/allocations/"+pathEscape(id), nil, nil, nil)
			if err != nil {
				return err
			}
			al, err := decode[proto.Allocation](r)
			if err != nil {
				return err
			}
			acc, err := sliceAccess(al)
			if err != nil {
				return err
			}
			if err := proto.ValidateID("allocation id", al.ID); err != nil {
				return err
			}
			for _, note := range sshNotes(al) {
				fmt.Fprintln(a.errOut, note)
			}
			if o.knownHosts, err = writeKnownHosts(al.ID, acc); err != nil {
				return err
			}
			argv := sshArgv(acc, o, extra)
			if o.print {
				_, err := fmt.Fprintln(a.out, shellJoin(argv))
				return err
			}
			path, err := exec.LookPath("ssh")
			if err != nil {
				return fmt.Errorf("ssh is not on PATH (install openssh-client); the command would be: %s", shellJoin(argv))
			}
			if err := execProcess(path, argv, os.Environ()); err != nil {
				return fmt.Errorf("run %s: %w", path, err)
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVarP(&o.identity, "identity", "i", "", "private key file, passed to ssh -i")
	f.BoolVar(&o.direct, "direct", false, "connect to the guest address directly, without the jump host")
	f.BoolVar(&o.print, "print", false, "print the ssh command instead of running it")
	return c
}

// shellJoin quotes argv for a POSIX shell.
func shellJoin(argv []string) string {
	out := make([]string, len(argv))
	for i, s := range argv {
		if s != "" && strings.IndexFunc(s, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("@%+=:,./_-", r))
		}) < 0 {
			out[i] = s
			continue
		}
		out[i] = "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}
