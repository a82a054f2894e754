package host

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// URLFile is the file in the state dir where a serving host records the
// URL of its public listener (http://HOST:PORT, https:// under TLS, the
// address a client on this machine dials), so that a client command
// given only the state dir reaches it; removed when the host stops.
const URLFile = "url"

// writeURL records u in stateDir's URLFile: written to a new file of
// mode 0600 and renamed over the old one (a link there is replaced,
// never followed).
func writeURL(stateDir, u string) error {
	f, err := os.CreateTemp(stateDir, ".url-*")
	if err != nil {
		return fmt.Errorf("recording the listen address: %w", err)
	}
	_, werr := f.WriteString(u + "\n")
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("recording the listen address: %w", err)
	}
	if err := os.Rename(f.Name(), filepath.Join(stateDir, URLFile)); err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("recording the listen address: %w", err)
	}
	return nil
}

// removeURL removes stateDir's URLFile when it still holds u (a host
// that started after this one on another state dir path does not lose
// its record).
func removeURL(stateDir, u string) {
	path := filepath.Join(stateDir, URLFile)
	if b, err := ReadURL(stateDir); err == nil && b == u {
		_ = os.Remove(path)
	}
}

// ReadURL returns the URL the host serving stateDir recorded, "" when
// none did. The file is opened without following a link.
func ReadURL(stateDir string) (string, error) {
	f, err := os.OpenFile(filepath.Join(stateDir, URLFile), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the recorded listen address: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return "", fmt.Errorf("reading the recorded listen address: %w", err)
	}
	u := strings.TrimSpace(string(b))
	if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		return "", fmt.Errorf("%s holds no URL", filepath.Join(stateDir, URLFile))
	}
	return u, nil
}
