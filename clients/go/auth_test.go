package fusebox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestTokenIsSent(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "fusebox.toml")
	os.WriteFile(cfg, []byte("[auth]\n[[auth.token]]\nname = \"admin\"\nrole = \"admin\"\nenv = \"FUSEBOX_GO_TEST_TOKEN\"\n"), 0o600)
	t.Setenv("FUSEBOX_GO_TEST_TOKEN", "s3cret-token-for-the-go-client-tests")
	s := startServer(t, "--config", cfg)

	without := newClient(t, s)
	err := without.Guard(context.Background(), "k", ok)
	var re *RequestError
	if !errors.As(err, &re) || status.Code(re.Err) != codes.Unauthenticated {
		t.Fatalf("want unauthenticated without a token, got %v", err)
	}
	with := newClient(t, s, WithToken("s3cret-token-for-the-go-client-tests"))
	if err := with.Guard(context.Background(), "k", ok); err != nil {
		t.Fatal(err)
	}
}
