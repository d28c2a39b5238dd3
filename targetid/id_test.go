package targetid

import "testing"

// TestIDString: the label keeps rank 0 and the endpoint as given, so that
// the series of every package join on it.
func TestIDString(t *testing.T) {
	tests := []struct {
		id   ID
		want string
	}{
		{ID{Endpoint: "http://10.0.0.7:8000"}, "http://10.0.0.7:8000#0"},
		{ID{Endpoint: "http://10.0.0.7:8000", Rank: 3}, "http://10.0.0.7:8000#3"},
		{ID{Endpoint: "https://[::1]:8443/v", Rank: 1}, "https://[::1]:8443/v#1"},
		{ID{}, "#0"},
	}
	for _, tt := range tests {
		if got := tt.id.String(); got != tt.want {
			t.Errorf("%#v.String() = %q, want %q", tt.id, got, tt.want)
		}
	}
}
