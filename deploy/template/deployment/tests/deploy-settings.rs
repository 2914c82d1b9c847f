"{{name}}" => Service::of::<{{name}}::config::Settings>(name, http, grpc),
