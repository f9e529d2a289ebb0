package httpconn

import (
	"strings"
	"testing"
)

func TestShownURLHidesQueryAndUser(t *testing.T) {
	got := shownURL("https://u:secret@api.example.com/v1/notes?api_key=s3cr3t")
	if strings.Contains(got, "secret") || strings.Contains(got, "s3cr3t") || !strings.HasPrefix(got, "https://api.example.com/v1/notes") {
		t.Fatalf("shownURL = %q", got)
	}
}
