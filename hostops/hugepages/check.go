package hugepages

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Need is what a profile asks of one pool: Count free pages of Size on a
// NUMA node (AnyNode: anywhere on the host).
type Need struct {
	Node  int
	Size  PageSize
	Count uint64
}

// NeedBytes converts a memory size into a Need. bytes must be a whole
// number of pages (a VM's hugepage-backed memory always is).
func NeedBytes(node int, size PageSize, bytes uint64) (Need, error) {
	if size == 0 {
		return Need{}, fmt.Errorf("hugepage need: page size is 0")
	}
	if bytes%size.Bytes() != 0 {
		return Need{}, fmt.Errorf("hugepage need: %d bytes is not a whole number of %s pages", bytes, size)
	}
	return Need{Node: node, Size: size, Count: bytes / size.Bytes()}, nil
}

// ShortageError says a pool has fewer free pages than a profile needs.
// Callers (the node scheduler) branch on it with errors.As.
type ShortageError struct {
	Node int
	Size PageSize
	Free uint64
	Need uint64
}

func (e *ShortageError) Error() string {
	return fmt.Sprintf("%s has %d free %s hugepages, profile needs %d (%s)",
		nodeName(e.Node), e.Free, e.Size, e.Need, humanBytes(e.Need*e.Size.Bytes()))
}

func nodeName(node int) string {
	if node == AnyNode {
		return "host"
	}
	return "NUMA node " + strconv.Itoa(node)
}

// Check fails fast, with the numbers, when topo cannot satisfy needs. Needs
// on the same pool add up. Every shortage is reported (errors.Join), in
// node and size order; each is a *ShortageError unless the node or pool
// does not exist at all.
func Check(topo Topology, needs ...Need) error {
	type key struct {
		node int
		size PageSize
	}
	sum := map[key]uint64{}
	var keys []key
	for _, n := range needs {
		if n.Count == 0 {
			continue
		}
		k := key{n.Node, n.Size}
		if _, ok := sum[k]; !ok {
			keys = append(keys, k)
		}
		sum[k] += n.Count
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].node != keys[j].node {
			return keys[i].node < keys[j].node
		}
		return keys[i].size < keys[j].size
	})
	var errs []error
	for _, k := range keys {
		if k.node != AnyNode {
			if _, ok := topo.Node(k.node); !ok {
				errs = append(errs, fmt.Errorf("NUMA node %d is not present (host has %s)", k.node, nodeList(topo)))
				continue
			}
		}
		p, ok := topo.Pool(k.node, k.size)
		if !ok {
			errs = append(errs, fmt.Errorf("%s has no %s hugepage pool", nodeName(k.node), k.size))
			continue
		}
		// Reserved pages are promised to mappings already made (only the
		// system-wide pools report them).
		free := p.Free - min(p.Reserved, p.Free)
		if free < sum[k] {
			errs = append(errs, &ShortageError{Node: k.node, Size: k.size, Free: free, Need: sum[k]})
		}
	}
	return errors.Join(errs...)
}

func nodeList(t Topology) string {
	if len(t.Nodes) == 0 {
		return "no NUMA nodes"
	}
	ids := make([]string, len(t.Nodes))
	for i, n := range t.Nodes {
		ids[i] = strconv.Itoa(n.ID)
	}
	return "NUMA nodes " + strings.Join(ids, ",")
}

func humanBytes(b uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	v, i := float64(b), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64) + " " + units[i]
}
