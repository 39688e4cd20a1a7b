fn main() {
    roce_cabi::link_cdylib("libmlx5.map", "libmlx5.so.1");
}
