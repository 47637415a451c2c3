package guest

import (
	"debug/pe"
	"fmt"
	"strconv"
)

// peSection is what the UKI layout needs of one section of the stub.
type peSection struct {
	Name        string
	VirtualAddr uint64 // RVA
	VirtualSize uint64
}

// ukiPart is one section added to the stub: a name and the file that
// becomes its content.
type ukiPart struct {
	Section string // .osrel, .cmdline, .linux, .initrd
	File    string
	Size    int64
}

// readStub reads the image base and sections of an EFI stub (a PE32+ file).
func readStub(path string) (imageBase uint64, secs []peSection, err error) {
	f, err := pe.Open(path)
	if err != nil {
		return 0, nil, fmt.Errorf("open EFI stub %s: %w", path, err)
	}
	defer f.Close()
	oh, ok := f.OptionalHeader.(*pe.OptionalHeader64)
	if !ok {
		return 0, nil, fmt.Errorf("EFI stub %s: not a PE32+ image", path)
	}
	for _, s := range f.Sections {
		secs = append(secs, peSection{Name: s.Name, VirtualAddr: uint64(s.VirtualAddress), VirtualSize: uint64(s.VirtualSize)})
	}
	return oh.ImageBase, secs, nil
}

const ukiAlign = 4096

func alignUp(v, a uint64) uint64 { return (v + a - 1) / a * a }

// ukiObjcopyArgs lays the parts out at 4 KiB-aligned virtual addresses after
// the stub's last section (what ukify does) and returns the objcopy
// arguments that add them to stub, writing out.
func ukiObjcopyArgs(imageBase uint64, stub []peSection, parts []ukiPart, stubPath, out string) ([]string, error) {
	if len(stub) == 0 {
		return nil, fmt.Errorf("EFI stub has no sections")
	}
	var end uint64
	for _, s := range stub {
		for _, p := range parts {
			if s.Name == p.Section {
				return nil, fmt.Errorf("EFI stub already has a %s section", s.Name)
			}
		}
		if e := s.VirtualAddr + s.VirtualSize; e > end {
			end = e
		}
	}
	next := alignUp(end, ukiAlign)
	var args []string
	for _, p := range parts {
		if p.Size <= 0 {
			return nil, fmt.Errorf("UKI section %s: %s is empty", p.Section, p.File)
		}
		args = append(args,
			"--add-section", p.Section+"="+p.File,
			"--change-section-vma", p.Section+"=0x"+strconv.FormatUint(imageBase+next, 16))
		next = alignUp(next+uint64(p.Size), ukiAlign)
	}
	return append(args, stubPath, out), nil
}
