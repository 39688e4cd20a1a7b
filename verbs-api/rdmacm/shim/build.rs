fn main() {
    roce_cabi::link_cdylib("librdmacm.map", "librdmacm.so.1");
}
