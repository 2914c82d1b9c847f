"{{name}}" => {
    Service { load: load_{{name}}, ..Service::of::<{{name}}::config::Settings>(name, http, grpc) }
}
