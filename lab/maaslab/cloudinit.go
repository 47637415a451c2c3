package maaslab

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// CloudConfig is the part of a #cloud-config document the lab applies
// (what coordinator/maasflow renders): files to write and commands to
// run, as cloud-init's write_files and runcmd modules do on a real host.
type CloudConfig struct {
	WriteFiles []WriteFile `yaml:"write_files"`
	RunCmd     [][]string  `yaml:"runcmd"`
}

// WriteFile is one write_files entry.
type WriteFile struct {
	Path        string `yaml:"path"`
	Permissions string `yaml:"permissions"`
	Content     string `yaml:"content"`
}

// ParseCloudConfig parses a #cloud-config user-data document.
func ParseCloudConfig(ud []byte) (CloudConfig, error) {
	var cc CloudConfig
	if !strings.HasPrefix(string(ud), "#cloud-config\n") {
		return cc, fmt.Errorf("user-data is not a #cloud-config document")
	}
	if err := yaml.Unmarshal(ud, &cc); err != nil {
		return cc, fmt.Errorf("parse cloud-config: %w", err)
	}
	for _, f := range cc.WriteFiles {
		if !filepath.IsAbs(f.Path) || filepath.Clean(f.Path) != f.Path {
			return cc, fmt.Errorf("cloud-config write_files: path %q is not a clean absolute path", f.Path)
		}
		if f.Permissions != "" {
			if _, err := strconv.ParseUint(f.Permissions, 8, 32); err != nil {
				return cc, fmt.Errorf("cloud-config write_files %s: permissions %q: %w", f.Path, f.Permissions, err)
			}
		}
	}
	for _, c := range cc.RunCmd {
		if len(c) == 0 {
			return cc, fmt.Errorf("cloud-config runcmd: an empty command")
		}
	}
	return cc, nil
}

// WriteFilesUnder writes the document's files under root (the simulated
// host's /), with their permissions.
func (cc CloudConfig) WriteFilesUnder(root string) error {
	for _, f := range cc.WriteFiles {
		dst := filepath.Join(root, f.Path)
		mode := os.FileMode(0o644)
		if f.Permissions != "" {
			m, _ := strconv.ParseUint(f.Permissions, 8, 32)
			mode = os.FileMode(m) & 0o777
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("cloud-init write %s: %w", f.Path, err)
		}
		if err := os.WriteFile(dst, []byte(f.Content), mode); err != nil {
			return fmt.Errorf("cloud-init write %s: %w", f.Path, err)
		}
		if err := os.Chmod(dst, mode); err != nil {
			return fmt.Errorf("cloud-init write %s: %w", f.Path, err)
		}
	}
	return nil
}

func jsonUnmarshal(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	return nil
}
