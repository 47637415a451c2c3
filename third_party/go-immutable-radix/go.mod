module github.com/hashicorp/go-immutable-radix

go 1.19

require github.com/hashicorp/go-uuid v1.0.0
